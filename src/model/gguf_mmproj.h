#pragma once
// llama.cpp's GGUF pair for Qwen2-VL / Qwen2.5-VL: the LLM's model.gguf (general.architecture
// "qwen2vl", read by GgufFile, whose multimodal keys are read here) and the "mmproj" GGUF beside
// it, the vision tower in the layout tools/mtmd/clip.cpp loads (projector types
// "qwen2vl_merger" / "qwen2.5vl_merger").
//
// Layout (as convert_hf_to_gguf.py's Qwen2VLVisionModel writes it): general.architecture "clip",
// clip.has_vision_encoder, clip.projector_type, clip.vision.* hyper-parameters, and tensors
//   v.patch_embd.weight, v.patch_embd.weight.1  the Conv3d [embed, C, 2, p, p] split into its two
//                                               temporal slices [embed, C, p, p]
//   v.blk.N.ln1 / ln2                           norm1 / norm2
//   v.blk.N.attn_q / attn_k / attn_v            attn.qkv split into thirds (weight and bias)
//   v.blk.N.attn_out                            attn.proj
//   v.blk.N.ffn_up / ffn_down                   mlp.fc1 / fc2 (Qwen2-VL), up_proj / down_proj
//   v.blk.N.ffn_gate                            mlp.gate_proj (Qwen2.5-VL)
//   v.post_ln                                   merger.ln_q
//   mm.0 / mm.2                                 merger.mlp.0 / merger.mlp.2
// The patch embedding is F32 (F16 when the file type is F16), 1-D tensors F32, other 2-D ones
// the requested type (F16 where Q8_0 cannot hold a row, as llama.cpp falls back).
//
// Thread-safety: the returned source is immutable and safe to share; the writer runs on the
// calling thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"
#include "model/tensor_source.h"
#include "model/vision_config.h"

namespace crescent::model {

class GgufFile;

// The multimodal fields of a "qwen2vl" LLM GGUF, for GgufFile::model_config(): mrope_section
// from qwen2vl.rope.dimension_sections (llama.cpp pads the three sections with a 0), and the
// image token ids looked up in tokenizer.ggml.tokens (<|image_pad|>, <|vision_start|>,
// <|vision_end|>), else Qwen's 151655 / 151652 / 151653. InvalidArgument for sections that do
// not sum to head_dim / 2 or ids outside the vocabulary (config must hold both already).
Status read_qwen2vl_text_config(const GgufFile& file, ModelConfig* config);

// "qwen2vl_merger" / "qwen2.5vl_merger": clip.projector_type for a tower.
std::string_view mmproj_projector_type(VisionArchitecture arch);

// Opens an mmproj GGUF and serves its tower under the Hugging Face names vision_tensor_specs()
// lists ("visual.blocks.3.attn.qkv.weight", ...) in HF shapes; q/k/v are re-joined into qkv and
// the two patch-embedding slices into one [embed, C, 2, p, p] tensor, materialised once and
// owned by the source (the rest are views of the mapping). Fills *config from the clip.*
// metadata and tensor shapes (the MLP width comes from ffn_up, since llama.cpp's converter
// writes Qwen2-VL's LLM width as feed_forward_length; window_size from clip.vision.window_size,
// else clip.cpp's 112; the full-attention blocks from clip.vision.n_wa_pattern).
// Errors: not a GGUF / not general.architecture "clip" / no vision encoder -> InvalidArgument
// naming the file; another projector type -> Unimplemented naming it; a missing key or tensor
// -> NotFound; a tensor of the wrong shape -> InvalidArgument naming it.
Result<std::unique_ptr<TensorSource>> open_mmproj(const std::string& path, VisionConfig* config);

// Writes the tower of `source` (HF "visual.*" names, vision_tensor_specs(vision) shapes) as an
// mmproj GGUF. 2-D tensors are stored as `dtype` (F32/F16/BF16/Q8_0). The fullatt blocks must
// be every n-th one (clip.cpp only knows n_wa_pattern), else InvalidArgument. progress
// (optional) is called with (bytes written, bytes total) after each tensor.
Status write_mmproj_gguf(const std::string& path, const VisionConfig& vision,
                         const TensorSource& source, DType dtype, const std::string& model_name,
                         const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace crescent::model
