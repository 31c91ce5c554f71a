#include "engine/engine.h"

#include <algorithm>
#include <sstream>

#include "core/check.h"
#include "core/clock.h"
#include "core/ids.h"
#include "core/logging.h"

namespace crescent::engine {
namespace {

int resolved_max_model_len(const EngineOptions& options, const ModelRunner& runner) {
  return options.max_model_len > 0 ? options.max_model_len
                                   : runner.num_kv_blocks() * runner.block_size();
}

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Length of the longest suffix of text that is a proper prefix of one of the stop strings:
// text that may yet turn into a stop string and must not be returned before that is decided.
size_t held_back_length(const std::string& text, const std::vector<std::string>& stops) {
  size_t longest = 0;
  for (const std::string& stop : stops) {
    const size_t max_len = std::min(text.size(), stop.size() - 1);
    for (size_t len = max_len; len > longest; --len) {
      if (text.compare(text.size() - len, len, stop, 0, len) == 0) {
        longest = len;
        break;
      }
    }
  }
  return longest;
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

Status Engine::validate_options(const EngineOptions& options, const ModelRunner& runner) {
  std::ostringstream os;
  if (options.block_size != runner.block_size()) {
    os << "block_size " << options.block_size << " differs from the runner's "
       << runner.block_size();
    return invalid_argument(os.str());
  }
  if (options.max_num_seqs < 1 || options.max_num_batched_tokens < 1) {
    return invalid_argument("max_num_seqs and max_num_batched_tokens must be positive");
  }
  if (runner.num_kv_blocks() < 1) {
    return invalid_argument("the runner has no KV blocks");
  }
  const int64_t capacity_tokens = int64_t{runner.num_kv_blocks()} * runner.block_size();
  if (options.max_model_len < 0 || options.max_model_len > capacity_tokens) {
    os << "max_model_len " << options.max_model_len << " does not fit in the KV cache ("
       << runner.num_kv_blocks() << " blocks of " << runner.block_size()
       << " tokens = " << capacity_tokens << " tokens); lower it or give the cache more memory";
    return invalid_argument(os.str());
  }
  return Status::ok();
}

Engine::Engine(EngineOptions options, ModelRunner* runner)
    : options_(std::move(options)),
      runner_(runner),
      kv_connector_(options_.kv_connector),
      vocab_size_(runner->vocab_size()),
      kv_event_log_(std::make_shared<KvEventLog>("engine-" + random_uuid(), runner->block_size())),
      block_manager_(runner->num_kv_blocks(), runner->block_size(), options_.enable_prefix_caching),
      scheduler_({options_.max_num_seqs, options_.max_num_batched_tokens}, &block_manager_),
      encoder_cache_(options_.encoder_cache_tokens) {
  Status valid = validate_options(options_, *runner);
  CRESCENT_CHECK(valid.is_ok()) << valid.to_string();
  options_.max_model_len = resolved_max_model_len(options_, *runner);
  block_manager_.set_event_log(kv_event_log_.get());
}

Engine::~Engine() = default;

Status Engine::validate_request(const EngineRequest& request) const {
  if (request.request_id.empty()) {
    return invalid_argument("request_id must not be empty");
  }
  if (request.prompt_token_ids.empty()) {
    return invalid_argument("the prompt is empty");
  }
  const int num_prompt = static_cast<int>(request.prompt_token_ids.size());
  if (num_prompt > options_.max_model_len) {
    std::ostringstream os;
    os << "the prompt has " << num_prompt << " tokens, more than this model's maximum context "
       << "length of " << options_.max_model_len << " tokens";
    return invalid_argument(os.str());
  }
  for (int32_t id : request.prompt_token_ids) {
    if (id < 0 || id >= vocab_size_) {
      std::ostringstream os;
      os << "prompt token id " << id << " is outside the vocabulary [0, " << vocab_size_ << ")";
      return invalid_argument(os.str());
    }
  }
  RETURN_IF_ERROR(validate(request.sampling, vocab_size_));
  if (request.sampling.guided.is_active() &&
      static_cast<int32_t>(options_.token_bytes.size()) != vocab_size_) {
    return invalid_argument(
        "guided decoding (response_format, guided_json, guided_choice) needs the tokenizer's "
        "token bytes, and this engine has none");
  }
  if (!request.sampling.stop.empty() && !options_.make_detokenizer) {
    return invalid_argument("stop strings need a detokenizer, and this engine has none");
  }
  RETURN_IF_ERROR(validate_multimodal(request));
  return validate_kv_transfer(request);
}

Status Engine::add_request(EngineRequest request) {
  RETURN_IF_ERROR(validate_request(request));
  if (requests_.contains(request.request_id)) {
    return already_exists("request id '" + request.request_id + "' is already in use");
  }
  if (held_for_remote_.contains(request.request_id) || fetch_limbo_.contains(request.request_id)) {
    return already_exists("request id '" + request.request_id +
                          "' is still in use by a KV transfer; use a fresh id");
  }
  auto r = std::make_unique<Request>();
  Sequence& seq = r->seq;
  seq.request_id = request.request_id;
  seq.num_prompt_tokens = static_cast<int>(request.prompt_token_ids.size());
  seq.token_ids = std::move(request.prompt_token_ids);
  seq.sampling = std::move(request.sampling);
  seq.arrival_time_ns = request.arrival_time_ns != 0 ? request.arrival_time_ns : now_ns();
  seq.arrival_order = next_arrival_order_++;
  seq.rng = Rng(seq.sampling.seed.has_value() ? *seq.sampling.seed : random_u64());
  seq.needs_remote_kv = request.kv_transfer_params.do_remote_prefill;
  r->kv_transfer_params = std::move(request.kv_transfer_params);
  init_multimodal(*r, std::move(request.mm_items));
  if (options_.make_detokenizer) {
    r->detokenizer = options_.make_detokenizer(seq.sampling.skip_special_tokens);
  }
  if (seq.sampling.guided.is_active()) {
    auto grammar = guided::compile(seq.sampling.guided);
    CRESCENT_CHECK(grammar.is_ok())
        << "validated constraint failed to compile: " << grammar.status().to_string();
    r->guided.emplace(*std::move(grammar));
    if (vocab_trie_ == nullptr) {
      vocab_trie_ = std::make_unique<guided::VocabTrie>(options_.token_bytes);
    }
  }
  r->pending.request_id = seq.request_id;
  scheduler_.add(&seq);
  requests_.emplace(seq.request_id, std::move(r));
  return Status::ok();
}

void Engine::abort(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return;
  }
  finish(*it->second, FinishReason::kAbort);
  aborted_outputs_.push_back(take_output(*it->second));
  requests_.erase(it);
}

void Engine::abort_all() {
  std::vector<std::string> ids;
  for (const auto& [id, r] : requests_) {
    ids.push_back(id);
  }
  for (const std::string& id : ids) {
    abort(id);
  }
}

Result<std::vector<RequestOutput>> Engine::step() {
  handle_connector_events();
  ScheduleResult schedule = scheduler_.schedule();
  start_remote_prefills(schedule);
  prepare_multimodal(schedule);
  const Status run_status = run_batch(schedule);
  return postprocess(schedule, run_status);
}

Status Engine::run_batch(const ScheduleResult& schedule) {
  if (schedule.is_empty()) {
    return Status::ok();
  }
  runner_batch_.clear();
  mm_positions_scratch_.clear();
  mm_embeddings_scratch_.clear();
  size_t num_logits_rows = 0;
  for (const ScheduledSeq& s : schedule.scheduled) {
    const Sequence& seq = *s.seq;
    RunnerSeq rs;
    rs.token_ids =
        std::span<const int32_t>(seq.token_ids).subspan(seq.num_computed_tokens, s.num_new_tokens);
    rs.start_pos = seq.num_computed_tokens;
    rs.block_table = seq.block_table;
    rs.needs_logits = s.needs_logits;
    if (!seq.mm_placeholders.empty()) {
      add_multimodal_inputs(*find_request(&seq), seq.num_computed_tokens, s.num_new_tokens, rs);
    }
    runner_batch_.push_back(rs);
    num_logits_rows += s.needs_logits ? 1 : 0;
  }
  logits_.clear();
  RETURN_IF_ERROR(runner_->execute(runner_batch_, logits_));
  if (logits_.size() != num_logits_rows * vocab_size_) {
    std::ostringstream os;
    os << "the runner returned " << logits_.size() << " logits for " << num_logits_rows
       << " rows of " << vocab_size_;
    return internal_error(os.str());
  }
  return Status::ok();
}

std::vector<RequestOutput> Engine::postprocess(const ScheduleResult& schedule,
                                               const Status& run_status) {
  std::vector<RequestOutput> outputs = std::move(aborted_outputs_);
  aborted_outputs_.clear();
  num_preemptions_total_ += static_cast<int64_t>(schedule.preempted.size());
  if (schedule.is_empty()) {
    return outputs;
  }
  ++num_steps_total_;

  if (!run_status.is_ok()) {
    CRESCENT_LOG(kError) << "model runner failed; failing " << schedule.scheduled.size()
                         << " requests: " << run_status.to_string();
    for (const ScheduledSeq& s : schedule.scheduled) {
      auto it = requests_.find(s.seq->request_id);
      CRESCENT_CHECK(it != requests_.end())
          << "scheduled request " << s.seq->request_id << " is unknown";
      it->second->pending.error_message = run_status.to_string();
      it->second->pending.error_code = StatusCode::kInternal;  // this server's own failure
      finish(*it->second, FinishReason::kError);
      outputs.push_back(take_output(*it->second));
      requests_.erase(it);
    }
    return outputs;
  }

  scheduler_.on_computed(schedule);
  for (const ScheduledSeq& s : schedule.scheduled) {
    if (!s.seq->mm_placeholders.empty() && s.seq->status == SequenceStatus::kRunning) {
      release_multimodal(*find_request(s.seq), /*all=*/false);
    }
  }
  size_t row = 0;
  for (const ScheduledSeq& s : schedule.scheduled) {
    if (!s.needs_logits) {
      continue;
    }
    auto it = requests_.find(s.seq->request_id);
    CRESCENT_CHECK(it != requests_.end())
        << "scheduled request " << s.seq->request_id << " is unknown";
    Request& r = *it->second;
    Sequence& seq = r.seq;
    std::span<const float> logits =
        std::span<const float>(logits_).subspan(row * vocab_size_, vocab_size_);
    ++row;
    TokenLogprobs logprobs;
    const bool want_logprobs = seq.sampling.logprobs.has_value();
    // min_tokens: the tokens that would end the request may not be drawn before it is reached.
    masked_token_ids_.clear();
    if (seq.num_output_tokens() < seq.sampling.min_tokens) {
      masked_token_ids_ = seq.sampling.stop_token_ids;
      if (!seq.sampling.ignore_eos) {
        for (int32_t id : options_.eos_token_ids) {
          if (id >= 0 && id < vocab_size_) {
            masked_token_ids_.push_back(id);
          }
        }
      }
    }
    compute_allowed_tokens(r);
    const int32_t token =
        sampler_.sample(logits, seq.sampling, seq.rng, want_logprobs ? &logprobs : nullptr,
                        masked_token_ids_, allowed_token_ids_);
    if (r.guided.has_value() && !contains(options_.eos_token_ids, token)) {
      // The token was allowed, so its bytes advance the grammar; a failure (only when min_tokens
      // forced a choice outside it) leaves the output unconstrained from here on.
      if (!r.guided->advance(options_.token_bytes[token])) {
        r.guided.reset();
      }
    }
    if (want_logprobs) {
      r.pending.logprobs.push_back(std::move(logprobs));
    }
    append_token(r, token);
    outputs.push_back(take_output(r));
    if (seq.is_finished()) {
      requests_.erase(it);
    }
  }
  return outputs;
}

void Engine::compute_allowed_tokens(Request& r) {
  allowed_token_ids_.clear();
  if (!r.guided.has_value()) {
    return;
  }
  vocab_trie_->allowed_tokens(*r.guided, &allowed_token_ids_);
  if (r.guided->is_accepting() || allowed_token_ids_.empty()) {
    // A complete value may end here. Nothing allowed (a token-less dead end, e.g. the nesting
    // limit) also ends it rather than letting the model write outside the grammar.
    for (int32_t id : options_.eos_token_ids) {
      if (id >= 0 && id < vocab_size_) {
        allowed_token_ids_.push_back(id);
      }
    }
  }
  if (allowed_token_ids_.empty()) {
    r.guided.reset();  // no EOS to end with: nothing can be enforced
  }
}

void Engine::append_token(Request& r, int32_t token_id) {
  Sequence& seq = r.seq;
  const SamplingParams& sp = seq.sampling;
  seq.token_ids.push_back(token_id);
  r.pending.new_token_ids.push_back(token_id);
  ++num_generation_tokens_total_;
  if (seq.num_output_tokens() == 1) {
    num_prompt_tokens_total_ += seq.num_prompt_tokens;
  }

  FinishReason reason = FinishReason::kNone;
  // The first min_tokens tokens never end the request, except by length (vLLM's rule).
  const bool can_stop = seq.num_output_tokens() > sp.min_tokens;
  if (can_stop && ((!sp.ignore_eos && contains(options_.eos_token_ids, token_id)) ||
                   contains(sp.stop_token_ids, token_id))) {
    // The stop token stays in the token ids; its text is returned only when asked for.
    r.pending.stop_token_id = token_id;
    reason = FinishReason::kStop;
    if (sp.include_stop_str_in_output && r.detokenizer) {
      r.held_text += r.detokenizer->push(token_id);
    }
  } else {
    if (r.detokenizer) {
      r.held_text += r.detokenizer->push(token_id);
    }
    if (seq.num_output_tokens() >= sp.max_tokens || seq.num_tokens() >= options_.max_model_len) {
      reason = FinishReason::kLength;
    }
  }
  if (release_text(r, reason != FinishReason::kNone, can_stop)) {
    reason = FinishReason::kStop;
    r.pending.stop_token_id = -1;
  }
  if (reason != FinishReason::kNone) {
    finish(r, reason);
  }
}

bool Engine::release_text(Request& r, bool final, bool can_stop) {
  if (!r.detokenizer) {
    return false;
  }
  if (final) {
    r.held_text += r.detokenizer->flush();
  }
  const SamplingParams& sp = r.seq.sampling;
  const std::vector<std::string>& stops = sp.stop;
  // Everything returned so far is free of stop strings and of their beginnings, so a match
  // can only lie within the held text, and must end after the bytes decoded before
  // min_tokens was reached.
  size_t first = std::string::npos;
  const std::string* matched = nullptr;
  const size_t num_unmatchable = r.num_held_bytes_before_min_tokens;
  if (can_stop) {
    for (const std::string& stop : stops) {
      const size_t from = num_unmatchable >= stop.size() ? num_unmatchable - stop.size() + 1 : 0;
      const size_t pos = r.held_text.find(stop, from);
      if (pos < first) {
        first = pos;
        matched = &stop;
      }
    }
  }
  if (matched != nullptr) {
    const size_t end = first + (sp.include_stop_str_in_output ? matched->size() : 0);
    r.pending.new_text.append(r.held_text, 0, end);
    r.pending.stop_reason = *matched;
    r.held_text.clear();
    r.num_held_bytes_before_min_tokens = 0;
    return true;
  }
  const size_t keep = final ? 0 : held_back_length(r.held_text, stops);
  const size_t num_released = r.held_text.size() - keep;
  r.pending.new_text.append(r.held_text, 0, num_released);
  r.held_text.erase(0, num_released);
  r.num_held_bytes_before_min_tokens =
      can_stop ? num_unmatchable - std::min(num_unmatchable, num_released) : r.held_text.size();
  return false;
}

void Engine::finish(Request& r, FinishReason reason) {
  if (r.seq.is_finished()) {
    return;
  }
  if (r.kv_transfer_params.is_remote()) {
    finish_remote(r, reason);
  }
  release_multimodal(r, /*all=*/true);
  scheduler_.finish(&r.seq);
  r.pending.finished = true;
  r.pending.finish_reason = reason;
}

RequestOutput Engine::take_output(Request& r) {
  RequestOutput out = std::move(r.pending);
  out.num_prompt_tokens = r.seq.num_prompt_tokens;
  out.num_output_tokens = r.seq.num_output_tokens();
  out.num_cached_tokens = r.seq.num_cached_tokens;
  r.pending = RequestOutput();
  r.pending.request_id = r.seq.request_id;
  return out;
}

bool Engine::has_unfinished_requests() const {
  return !requests_.empty() || !aborted_outputs_.empty() || !held_for_remote_.empty() ||
         !fetch_limbo_.empty();
}

EngineStats Engine::stats() const {
  const BlockManagerStats bm = block_manager_.stats();
  EngineStats s;
  s.num_running = scheduler_.num_running();
  s.num_waiting = scheduler_.num_waiting();
  s.num_waiting_for_remote_kv = scheduler_.num_parked();
  s.num_blocks_total = bm.num_blocks_total;
  s.num_blocks_used = bm.num_blocks_used;
  for (const auto* held : {&held_for_remote_, &fetch_limbo_}) {
    for (const auto& [id, seq] : *held) {
      s.num_blocks_held_for_remote += static_cast<int>(seq.block_table.size());
    }
  }
  s.prefix_cache_queries_tokens = bm.prefix_cache_queries_tokens;
  s.prefix_cache_hits_tokens = bm.prefix_cache_hits_tokens;
  s.num_prompt_tokens_total = num_prompt_tokens_total_;
  s.num_generation_tokens_total = num_generation_tokens_total_;
  s.num_preemptions_total = num_preemptions_total_;
  s.num_steps_total = num_steps_total_;
  s.encoder_cache = encoder_cache_.stats();
  s.num_images_encoded_total = num_images_encoded_total_;
  s.num_encoder_tokens_total = num_encoder_tokens_total_;
  s.encoder_seconds_total = encoder_seconds_total_;
  return s;
}

Status Engine::check_invariants() const {
  std::vector<const Sequence*> live;
  for (const auto& [id, r] : requests_) {
    live.push_back(&r->seq);
    const Sequence& seq = r->seq;
    const SequenceStatus st = seq.status;
    const bool in_running = std::ranges::count(scheduler_.running(), &seq) == 1;
    const bool in_waiting = std::ranges::count(scheduler_.waiting(), &seq) == 1;
    const bool in_parked = std::ranges::count(scheduler_.parked(), &seq) == 1;
    bool ok = false;
    switch (st) {
      case SequenceStatus::kRunning:
        ok = in_running && !in_waiting && !in_parked;
        break;
      case SequenceStatus::kWaiting:
      case SequenceStatus::kPreempted:
        ok = in_waiting && !in_running && !in_parked && seq.block_table.empty();
        break;
      case SequenceStatus::kWaitingForRemoteKv:
        // Parked with blocks for its whole prompt, which a peer is filling.
        ok = in_parked && !in_running && !in_waiting && r->kv_transfer_params.do_remote_prefill &&
             seq.num_tokens() == seq.num_prompt_tokens &&
             static_cast<int>(seq.block_table.size()) ==
                 block_manager_.num_blocks_for_tokens(seq.num_prompt_tokens);
        break;
      case SequenceStatus::kFinished:
        ok = false;  // finished requests leave requests_ in the same step
        break;
    }
    if (!ok) {
      return internal_error("engine invariant: request " + id +
                            " is not queued exactly once as its status says");
    }
  }
  if (live.size() !=
      scheduler_.running().size() + scheduler_.waiting().size() + scheduler_.parked().size()) {
    return internal_error("engine invariant: the scheduler holds requests the engine does not");
  }
  for (const auto* held : {&held_for_remote_, &fetch_limbo_}) {
    for (const auto& [id, seq] : *held) {
      if (requests_.contains(id) || seq.status != SequenceStatus::kFinished) {
        return internal_error("engine invariant: blocks held for a KV transfer of " + id +
                              " belong to a live request");
      }
      live.push_back(&seq);
    }
  }
  return block_manager_.check_invariants(live);
}

}  // namespace crescent::engine
