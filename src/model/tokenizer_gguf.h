#pragma once
// The tokenizer a GGUF file carries in its tokenizer.* metadata (llama.cpp's layout), turned
// into the same Tokenizer a Hugging Face tokenizer.json gives: ids, decoding and special tokens
// equal the tokenizer.json path for the families below. Only tokenizer.ggml.model "gpt2"
// (byte-level BPE) is read; "llama" (SentencePiece) and the rest are Unimplemented.
//
// tokenizer.ggml.pre picks what tokenizer.json spells out and GGUF only names:
//   "qwen2"                            NFC normaliser, Qwen2's split regex (single digits)
//   "llama3", "llama-v3", "llama-bpe"  Llama-3's split regex (digits in threes), ignore_merges
//   "gpt2", "gpt-2", "default"         GPT-2's ByteLevel regex
// An unknown name is Unimplemented naming it (a wrong regex would silently change the ids).
//
// Token types: 3 (control) become special added tokens, 4 (user-defined) non-special added
// tokens, both matched in the raw text; 5 (unused: llama.cpp's "[PAD123]" fillers up to the
// model's vocab_size) are left out, as tokenizer.json has no entry for them; the rest are the
// BPE vocabulary. A BOS is prepended when tokenizer.ggml.add_bos_token says so (absent: only for
// the Llama-3 names, as llama.cpp does), an EOS appended for add_eos_token.

#include <memory>
#include <string>

#include "core/status.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace crescent::model {

struct GgufTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  // bos/eos/pad token strings from their ids, and tokenizer.chat_template ("" if none).
  TokenizerConfig config;
};

// True if `gguf` carries a tokenizer at all (tokenizer.ggml.model or tokenizer.ggml.tokens).
bool gguf_has_tokenizer(const GgufFile& gguf);

// The tokenizer.json text equivalent to the file's tokenizer metadata.
Result<std::string> gguf_tokenizer_json(const GgufFile& gguf);

// The tokenizer and its config; errors name the file and the key at fault.
Result<GgufTokenizer> tokenizer_from_gguf(const GgufFile& gguf);

}  // namespace crescent::model
