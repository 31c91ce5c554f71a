#pragma once
// Engine: the single-threaded core that turns requests into tokens. Each step() schedules a
// batch (Scheduler + BlockManager), runs it on the ModelRunner, then samples, detokenizes and
// checks stop conditions, returning one incremental RequestOutput per request that produced
// something. Owns its sequences; borrows the runner (and the KV connector, when it has one),
// which must outlive it. With a connector it also moves requests' KV to or from another
// engine at the points kv_connector.h fixes (the hooks live in engine_kv.cc).
// Not thread-safe: use it from one thread (EngineLoop runs it on its own thread).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/block_manager.h"
#include "engine/detokenizer.h"
#include "engine/encoder_cache.h"
#include "engine/encoder_runner.h"
#include "engine/guided/matcher.h"
#include "engine/guided/vocab_trie.h"
#include "engine/kv_connector.h"
#include "engine/kv_events.h"
#include "engine/model_runner.h"
#include "engine/multimodal.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"

namespace crescent::engine {

struct EngineOptions {
  int block_size = 16;  // must equal the runner's
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  // Longest prompt + output. 0: the whole KV pool. Must fit in the runner's KV blocks.
  int max_model_len = 0;
  bool enable_prefix_caching = true;
  std::vector<int32_t> eos_token_ids;
  // Makes one request's detokenizer. Empty: no text is produced and stop strings are refused.
  std::function<std::unique_ptr<Detokenizer>(bool skip_special_tokens)> make_detokenizer;
  // Each token id's bytes as it decodes on its own ("" for special tokens), for guided
  // decoding (SamplingParams::guided). Empty: guided requests are refused.
  std::vector<std::string> token_bytes;
  // P/D disaggregation (see kv_connector.h): borrowed, must outlive the engine and the
  // EngineLoop running it. Null: a plain engine that refuses requests with kv_transfer_params.
  // Set it in the options before constructing the Engine; it cannot change afterwards.
  KvConnector* kv_connector = nullptr;
  // Vision-language models: the image encoder (borrowed, like the runner). Null: requests with
  // images are refused unless every image comes with its embeddings.
  EncoderRunner* encoder_runner = nullptr;
  // Encoder cache budget in embedding rows; an image larger than this is refused.
  int64_t encoder_cache_tokens = 16384;
  // Embedding rows the encoder may produce in one step (0: max_num_batched_tokens). A prompt
  // chunk that would need more waits for a later step; one image is always allowed per step,
  // so a larger image still makes progress.
  int max_num_encoder_tokens_per_step = 0;
};

struct EngineRequest {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;
  int64_t arrival_time_ns = 0;  // 0: now
  // do_remote_prefill: fetch the prompt's K/V from a prefill engine (decode side);
  // do_remote_decode: keep it for a decode engine after finishing (prefill side).
  KvTransferParams kv_transfer_params;
  // Images: placeholder runs in prompt_token_ids, ordered (see multimodal.h).
  std::vector<MultiModalItem> mm_items;
};

enum class FinishReason {
  kNone,    // not finished
  kStop,    // eos, a stop token or a stop string
  kLength,  // max_tokens or max_model_len
  kAbort,   // abort() or shutdown
  kError,   // the runner failed on this request's batch, or its remote KV fetch failed
};
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "abort", "error"

// What one request produced since its previous output.
struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> new_token_ids;
  std::string new_text;  // never contains a stop string; may lag the tokens (held back)
  std::vector<TokenLogprobs> logprobs;  // one per new token when logprobs were asked for
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;                  // the stop string that matched
  int32_t stop_token_id = -1;               // the stop token (eos or stop_token_ids) that matched
  std::string error_message;                // kError: why
  StatusCode error_code = StatusCode::kOk;  // kError: its kind (kDeadlineExceeded, ...)
  int num_prompt_tokens = 0;
  int num_output_tokens = 0;  // so far
  int num_cached_tokens = 0;  // prompt tokens served by the prefix cache
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int num_waiting_for_remote_kv = 0;  // decode side: parked until a prefill engine sends KV
  int num_blocks_total = 0;
  int num_blocks_used = 0;  // includes the held ones below
  // Block references kept for a peer: prefill side, finished requests whose KV a decode engine
  // still reads; decode side, aborted fetches a peer may still be writing into.
  int num_blocks_held_for_remote = 0;
  int64_t prefix_cache_queries_tokens = 0;
  int64_t prefix_cache_hits_tokens = 0;
  int64_t num_prompt_tokens_total = 0;      // prompt tokens of requests that began output
  int64_t num_generation_tokens_total = 0;  // sampled tokens
  int64_t num_preemptions_total = 0;
  int64_t num_steps_total = 0;
  // Vision encoder and its cache.
  EncoderCacheStats encoder_cache;
  int64_t num_images_encoded_total = 0;
  int64_t num_encoder_tokens_total = 0;  // embedding rows produced by the encoder
  double encoder_seconds_total = 0;
};

class Engine {
 public:
  // Checks the options against the runner (block size, max_model_len vs the KV pool).
  static Status validate_options(const EngineOptions& options, const ModelRunner& runner);

  // CHECKs validate_options.
  Engine(EngineOptions options, ModelRunner* runner);
  ~Engine();

  // AlreadyExists for a live request id (or one whose blocks are still held for a KV
  // transfer); InvalidArgument for an empty prompt, a prompt longer than max_model_len, token
  // ids outside the vocabulary, bad sampling params, kv_transfer_params without a connector.
  Status add_request(EngineRequest request);
  // The checks of add_request that do not depend on the engine's state. Thread-safe.
  Status validate_request(const EngineRequest& request) const;
  // Frees the request's blocks at once; its final output (kAbort) comes from the next step().
  // A request waiting for remote KV keeps its blocks (a peer may be writing into them) until
  // the connector reports on it; its kAbort output still comes from the next step().
  // Unknown or finished ids are ignored.
  void abort(const std::string& request_id);
  void abort_all();

  // Takes the connector's events, then schedule -> execute -> sample and postprocess. A runner
  // failure fails that batch's requests (kError) and leaves the engine usable.
  Result<std::vector<RequestOutput>> step();

  // True while a request is live, an output is undelivered, or blocks are held for a peer.
  bool has_unfinished_requests() const;
  // Shutdown when the connector did not report in time: frees every block held for a peer or
  // for a cancelled fetch (calling cancel() for the held ones) as if the events had come.
  void drop_remote_holds();
  EngineStats stats() const;
  // The prefix cache's stored/evicted hashes (kv_events.h), readable from any thread; its
  // engine id is new for every Engine.
  std::shared_ptr<const KvEventLog> kv_event_log() const { return kv_event_log_; }
  const EngineOptions& options() const { return options_; }
  Status check_invariants() const;  // for tests

 private:
  struct Request {
    Sequence seq;
    KvTransferParams kv_transfer_params;
    std::vector<MultiModalItem> mm_items;
    // Per item: its embeddings while this request holds them (an encoder cache reference, or
    // the item's own precomputed embeddings); null otherwise.
    std::vector<EncoderCache::Embeddings> mm_embeddings;
    std::vector<int32_t> mrope_positions;  // [num_prompt_tokens][3] when mm_items is not empty
    int mrope_delta = 0;                   // later tokens: index + delta on every axis
    std::unique_ptr<Detokenizer> detokenizer;
    // Guided decoding: where the output stands in its grammar. Absent: unconstrained.
    std::optional<guided::Matcher> guided;
    std::string held_text;  // decoded but not returned: might begin a stop string
    // The leading bytes of held_text decoded before min_tokens was reached: no stop string
    // may end in them.
    size_t num_held_bytes_before_min_tokens = 0;
    RequestOutput pending;  // accumulates until the next output
  };

  Status run_batch(const ScheduleResult& schedule);
  std::vector<RequestOutput> postprocess(const ScheduleResult& schedule, const Status& run_status);
  // Fills allowed_token_ids_ with what r's grammar allows next (EOS once the output is a
  // complete value); empty when r is unconstrained.
  void compute_allowed_tokens(Request& r);
  // Appends a sampled token and decides whether the request is finished.
  void append_token(Request& request, int32_t token_id);
  // Ends the request: its blocks are freed, or kept for the connector (see kv_connector.h).
  void finish(Request& request, FinishReason reason);
  // Moves decoded text to the pending output, holding back what may begin a stop string;
  // final: flush the detokenizer and hold nothing. can_stop: min_tokens is reached, so stop
  // strings are matched. True when a stop string matched.
  bool release_text(Request& request, bool final, bool can_stop);
  RequestOutput take_output(Request& request);

  // Vision-language hooks (engine_mm.cc).
  Status validate_multimodal(const EngineRequest& request) const;
  void init_multimodal(Request& request, std::vector<MultiModalItem> items);
  // Trims prompt chunks to the step's encoder budget, runs the encoder for the images the
  // remaining chunks reach (failing a request whose image cannot be encoded) and takes the
  // requests' references on the embeddings they need.
  void prepare_multimodal(ScheduleResult& schedule);
  // Fills rs.positions3 / rs.embeddings for a scheduled chunk of r (scratch in mm_scratch_).
  void add_multimodal_inputs(const Request& r, int start, int num_new, RunnerSeq& rs);
  // Drops the references on embeddings that r no longer needs (all of them when `all`).
  void release_multimodal(Request& r, bool all);
  Request* find_request(const Sequence* seq);

  // The P/D disaggregation hooks (engine_kv.cc).
  Status validate_kv_transfer(const EngineRequest& request) const;
  void handle_connector_events();
  void start_remote_prefills(const ScheduleResult& schedule);
  // Called by finish() for a request with kv_transfer_params, before its blocks are freed:
  // moves them to held_for_remote_ / fetch_limbo_ when a peer still needs them.
  void finish_remote(Request& request, FinishReason reason);
  // A Sequence that owns seq's block references (and nothing else); seq is left without any.
  static Sequence take_blocks(Sequence& seq);

  EngineOptions options_;
  ModelRunner* runner_;
  KvConnector* kv_connector_;  // options_.kv_connector
  int32_t vocab_size_;
  std::shared_ptr<KvEventLog> kv_event_log_;  // before block_manager_, which records into it
  BlockManager block_manager_;
  Scheduler scheduler_;
  Sampler sampler_;
  std::vector<int32_t> masked_token_ids_;  // scratch: what min_tokens holds back this draw
  // Guided decoding: the vocabulary as a byte trie (built at the first guided request) and
  // scratch for the tokens a request's grammar allows this draw.
  std::unique_ptr<guided::VocabTrie> vocab_trie_;
  std::vector<int32_t> allowed_token_ids_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  // Prefill side: finished requests whose blocks the connector holds until kBlocksReleased.
  std::unordered_map<std::string, Sequence> held_for_remote_;
  // Decode side: aborted fetches whose blocks a peer may still write until kRemoteKvReady.
  std::unordered_map<std::string, Sequence> fetch_limbo_;
  std::vector<RequestOutput> aborted_outputs_;  // final outputs returned by the next step()
  std::vector<RunnerSeq> runner_batch_;
  EncoderCache encoder_cache_;
  // Per-step storage behind runner_batch_'s positions3 / embeddings spans.
  std::vector<std::vector<int32_t>> mm_positions_scratch_;
  std::vector<std::vector<InputEmbeddings>> mm_embeddings_scratch_;
  int64_t num_images_encoded_total_ = 0;
  int64_t num_encoder_tokens_total_ = 0;
  double encoder_seconds_total_ = 0;
  std::vector<float> logits_;
  uint64_t next_arrival_order_ = 0;
  int64_t num_prompt_tokens_total_ = 0;
  int64_t num_generation_tokens_total_ = 0;
  int64_t num_preemptions_total_ = 0;
  int64_t num_steps_total_ = 0;
};

}  // namespace crescent::engine
