// The rollout engine (Engine in kf/policy/policy.h): block pool, admission, prefill, paged decode, stops.
// It serves many requests (a prompt and n samples of it, e.g. a GRPO group) at once:
//   - continuous batching: the running batch is re-formed every `check_every` decode steps;
//     a sequence that ended (EOS, loop, max tokens) leaves it there and a waiting request
//     joins (its prompt is prefilled, its first tokens sampled);
//   - a paged KV cache: per layer one pool of fixed-size blocks (block_size tokens) sized by
//     a memory budget in bytes; each sequence has a block table. A request is admitted only
//     when the pool can hold all of its samples at their longest (prompt + max_new_tokens),
//     so a running sequence never waits for memory and nothing is preempted;
//   - the prompt prefilled once per request: its blocks are shared by the n samples by
//     reference count; the last, partial block is copied on the first write of a sample
//     that does not own it alone (copy-on-write);
//   - attention reads a working copy of the batch's keys and values, gathered from the
//     blocks into logical order once per chunk of check_every steps (each step appends its
//     token to the copy and to the pool): one gather per chunk, contiguous reads per step,
//     at the cost of holding that copy (about the running sequences' KV once more);
//   - on CUDA, the decode step (model forward to logits) is captured as a CUDA graph per
//     (batch bucket, KV-length bucket) and replayed; the batch is padded to its bucket with
//     rows that write to a reserved scratch block. On the CPU the step runs eagerly
//     (padding only when EngineOptions::pad_batch asks for it, which tests use to show
//     that padding does not change results).
// Tokens are drawn by sample_tokens (src/sampler.h: the Sampler's code) and each token's
// log-prob is log softmax(logits / temperature) of the full vocabulary, as the learner
// recomputes it. Randomness comes from one generator per engine (EngineOptions::seed): a
// request's SamplingParams::seed, stop strings, static_decode, cuda_graph, shared_prefill
// and gpu_share are not used. Greedy decoding does not depend on the batch (up to float
// rounding of the attention sums). submit() refuses (kf::Error) an empty prompt, a token
// outside the vocab, n < 1, max_new_tokens < 1, stop strings, or a request that could never
// fit the KV budget (saying how many MB it needs); the constructor refuses a pool of fewer
// than two blocks, naming actors.engine.kv_budget_mb.
//
// Layout: per layer, keys and values are one pool each, [blocks * block_size, kv_heads,
// head_dim] (token-major), so a token's slot is block * block_size + offset and the write
// of a decode step is one index_copy_. Once per chunk each row's blocks are gathered in
// logical order into a working copy ([B * blocks_bucket * block_size, kv_heads, head_dim]);
// steps append to it and mask keys past the row's position: key j is the row's position j,
// so the mask is arange <= position and needs no host data. Block 0 is a scratch block
// that padding rows write to and read from.
#include "kf/policy/policy.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "kf/common/error.h"
#include "layers.h"
#include "sampler.h"

#ifdef KF_POLICY_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace kf::policy {

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// KV-length buckets: n blocks rounded up to a multiple of a quarter of its power of two
// (at most 25% padding, about four buckets per doubling).
int64_t blocks_bucket(int64_t n) {
  if (n <= 4) return std::max<int64_t>(n, 1);
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  const int64_t q = p / 4;
  return ceil_div(n, q) * q;
}

}  // namespace

struct Engine::Impl {
  CausalLM model{nullptr};
  EngineOptions o;
  ModelConfig cfg;
  torch::Device dev{torch::kCPU};
  int64_t bs = 16;
  // The pool.
  std::vector<torch::Tensor> pk, pv;  // per layer [blocks * bs, kv_heads, head_dim]
  std::vector<int32_t> refs;          // per block
  std::vector<int32_t> free_list;
  int64_t reserved = 0;  // blocks promised to admitted sequences, not yet taken
  int64_t peak_used = 0;
  at::Generator gen;
  EngineStats st;

  struct Request {
    EngineRequest r;
    Clock::time_point submitted, admitted;
    int64_t open = 0;  // samples not finished
    std::vector<Completion> out;
    int64_t own_blocks = 0;  // each sample's worst-case own blocks
  };
  struct Seq {
    std::shared_ptr<Request> req;
    int64_t index = 0;           // sample index in the request
    std::vector<int32_t> table;  // block table
    int64_t kv_len = 0;          // tokens in the KV cache
    int64_t reserve_left = 0;    // reservation not yet turned into blocks
    int32_t last = 0;            // the newest sampled token (not yet in the cache)
  };
  std::deque<std::shared_ptr<Request>> waiting;
  std::vector<Seq> running;
  std::vector<EngineResult> finished;

  // A decode batch: its inputs and the working copy of its rows' keys and values, gathered
  // from the pool once per chunk (the chunk's steps append to it and to the pool), so a
  // step's attention reads contiguous memory. With CUDA graphs one Work per (rows, blocks)
  // bucket stays allocated as the graph's static memory (least recently used ones are
  // dropped beyond the KV budget); otherwise a fresh one per chunk.
  struct Work {
    torch::Tensor tok, pos, table, logits;  // [B], [B], [B, NB]; [B, V]
    std::vector<torch::Tensor> kb, vb;      // per layer [B * NB * bs, kv_heads, head_dim]
    int uses = 0;
    int64_t last_used = 0, bytes = 0;
#ifdef KF_POLICY_CUDA
    std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
  };
  std::map<std::pair<int64_t, int64_t>, Work> works;
  int64_t work_clock = 0, work_bytes = 0;
#ifdef KF_POLICY_CUDA
  std::optional<at::cuda::MempoolId_t> pool_id;
  std::optional<c10::cuda::CUDAStream> stream;
#endif
  bool use_graphs() const {
#ifdef KF_POLICY_CUDA
    return dev.is_cuda() && o.cuda_graph;
#else
    return false;
#endif
  }

  Work& work_for(int64_t B, int64_t NB) {
    const std::pair<int64_t, int64_t> key{B, NB};
    auto it = works.find(key);
    if (it == works.end()) {
      const int64_t elem = static_cast<int64_t>(torch::elementSize(model->options().dtype().toScalarType()));
      const int64_t bytes = 2 * cfg.num_hidden_layers * B * NB * bs * cfg.num_key_value_heads * cfg.head_dim * elem;
      const int64_t cap = o.kv_budget_mb * 1024 * 1024;
      while (work_bytes + bytes > cap && !works.empty()) {
        auto lru = works.begin();
        for (auto w = works.begin(); w != works.end(); ++w)
          if (w->second.last_used < lru->second.last_used) lru = w;
        work_bytes -= lru->second.bytes;
        works.erase(lru);
        ++st.graphs_dropped;
      }
#ifdef KF_POLICY_CUDA
      // The graphs share one private memory pool, which the allocator frees with its last
      // graph; capturing into that freed pool's id again fails an allocator assertion
      // (seen on an H100 when the 1.5B bench dropped every graph), so take a new id then.
      if (std::none_of(works.begin(), works.end(), [](const auto& kv) { return kv.second.graph != nullptr; }))
        pool_id.reset();
#endif
      it = works.emplace(key, Work{}).first;
      it->second.bytes = bytes;
      work_bytes += bytes;
    }
    it->second.last_used = ++work_clock;
    return it->second;
  }

  int64_t used_blocks() const { return static_cast<int64_t>(refs.size()) - 1 - static_cast<int64_t>(free_list.size()); }

  int32_t take_block() {
    if (free_list.empty()) throw Error("engine: KV block pool exhausted (reservation accounting broke)");
    const int32_t b = free_list.back();
    free_list.pop_back();
    refs[b] = 1;
    peak_used = std::max(peak_used, used_blocks());
    return b;
  }
  void release_block(int32_t b) {
    if (--refs[b] == 0) free_list.push_back(b);
  }

  int64_t bucket_rows(int64_t B) const {
    const bool pad = o.pad_batch || dev.is_cuda();
    if (!pad) return B;
    for (int64_t b : o.batch_buckets)
      if (b >= B) return b;
    return B;
  }

  // Token slots of positions [from, from + n) of a block table, as flat pool rows.
  torch::Tensor slots(const std::vector<int32_t>& table, int64_t from, int64_t n) const {
    std::vector<int64_t> s(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = from + i;
      s[static_cast<std::size_t>(i)] = int64_t(table[static_cast<std::size_t>(p / bs)]) * bs + p % bs;
    }
    return torch::tensor(s, torch::kInt64).to(dev);
  }

  // One decode step of batch w: writes each row's new key/value to its pool slot and to
  // its working copy, attends over the working copy (key j is the row's position j, so the
  // mask is arange <= position). Fixed shapes and no host syncs: capturable.
  torch::Tensor decode(Work& w) {
    const auto &tok = w.tok, &pos = w.pos, &table = w.table;
    const int64_t B = tok.size(0), NB = table.size(1), L = NB * bs;
    const int64_t heads = cfg.num_attention_heads, kvh = cfg.num_key_value_heads, hd = cfg.head_dim;
    const int64_t groups = heads / kvh;
    const auto i64 = pos.options();
    const auto slot = table.gather(1, pos.div(bs, "floor").unsqueeze(1)).squeeze(1) * bs + pos.remainder(bs);
    const auto wslot = torch::arange(B, i64) * L + pos;
    const auto mask = (torch::arange(L, i64).unsqueeze(0) <= pos.unsqueeze(1)).view({B, 1, 1, L});
    const RopeTables r = model->rope(pos.unsqueeze(1));
    auto x = model->model->embed_tokens(tok.unsqueeze(1));  // [B, 1, H]
    for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
      auto* layer = model->model->layers[static_cast<std::size_t>(l)]->as<DecoderLayerImpl>();
      auto& att = *layer->self_attn;
      const auto a = layer->input_layernorm(x);
      auto [q, k, v3] = att.project(a);  // [B, heads | kvh, 1, D]
      const auto v = v3.reshape({B, kvh, hd});
      q = rotary(q, r.cos, r.sin);  // the model's rotary embedding: q [B, heads, 1, D]
      const auto kr = rotary(k, r.cos, r.sin).reshape({B, kvh, hd});
      pk[l].index_copy_(0, slot, kr);
      pv[l].index_copy_(0, slot, v);
      w.kb[l].index_copy_(0, wslot, kr);
      w.vb[l].index_copy_(0, wslot, v);
      const auto K = w.kb[l].view({B, L, kvh, hd}).transpose(1, 2);
      const auto V = w.vb[l].view({B, L, kvh, hd}).transpose(1, 2);
      // The G query heads of a KV head become G queries of one head (AttentionImpl's
      // decode path): the key mask broadcasts, no copy of K/V per query head.
      const auto qg = q.reshape({B, kvh, groups, hd});
      const auto o_ = at::scaled_dot_product_attention(qg, K, V, mask, 0.0, false).reshape({B, 1, heads * hd});
      const auto h = x + att.o_proj(o_);
      x = h + layer->mlp(layer->post_attention_layernorm(h));
    }
    return model->logits(model->model->norm(x)).squeeze(1);
  }

  // The step through batch w's CUDA graph when graphs are on (first use eager: warm-up of
  // cuBLAS and the allocator for these shapes; second: capture; then replay), else eager.
  torch::Tensor run_step(Work& w) {
#ifdef KF_POLICY_CUDA
    if (use_graphs()) {
      if (w.uses++ == 0) return decode(w);
      if (!w.graph) {
        if (!pool_id) pool_id = at::cuda::graph_pool_handle();
        w.graph = std::make_unique<at::cuda::CUDAGraph>();
        w.graph->capture_begin(*pool_id);
        w.logits = decode(w);
        w.graph->capture_end();
        ++st.graphs_captured;
      }
      w.graph->replay();
      return w.logits;
    }
#endif
    return decode(w);
  }

  void validate(const EngineRequest& r) const {
    const std::string what = "engine: request " + std::to_string(r.id);
    if (r.prompt.empty()) throw Error(what + ": empty prompt");
    if (r.n < 1) throw Error(what + ": n must be >= 1");
    const auto& p = r.sampling;
    if (p.max_new_tokens < 1) throw Error(what + ": max_new_tokens must be positive");
    if (!p.stop.empty()) throw Error(what + ": stop strings are not supported (use eos_ids)");
    if (p.loop_repeats < 0 || p.loop_repeats == 1)
      throw Error(what + ": loop_repeats must be 0 (off) or >= 2, not " + std::to_string(p.loop_repeats));
    if (p.loop_max_period < 1) throw Error(what + ": loop_max_period must be >= 1");
    if (p.loop_min_span < 0) throw Error(what + ": loop_min_span must be >= 0");
    for (int32_t t : r.prompt)
      if (t < 0 || t >= cfg.vocab_size)
        throw Error(what + ": prompt token " + std::to_string(t) + " outside the vocab");
  }

  // Worst-case blocks of a request: the prompt's, plus each sample's own (its copy of the
  // partial prompt block and the blocks its completion fills).
  std::pair<int64_t, int64_t> need_blocks(const EngineRequest& r) const {
    const int64_t P = static_cast<int64_t>(r.prompt.size());
    const int64_t longest = P + r.sampling.max_new_tokens - 1;  // the last token is never fed
    const int64_t own = ceil_div(longest, bs) - P / bs;
    return {ceil_div(P, bs), own};
  }

  bool admit_one() {
    sweep();
    auto& rq = waiting.front();
    const auto [prompt_blocks, own] = need_blocks(rq->r);
    const int64_t n = rq->r.n;
    if (static_cast<int64_t>(running.size()) + n > o.max_sequences && !running.empty()) return false;
    const int64_t avail = static_cast<int64_t>(free_list.size()) - reserved;
    if (prompt_blocks + n * own > avail) return false;
    auto req = rq;
    waiting.pop_front();
    req->admitted = Clock::now();
    req->own_blocks = own;
    req->open = n;
    req->out.assign(static_cast<std::size_t>(n), Completion{});
    prefill(req, prompt_blocks, own);
    return true;
  }

  // Prefill the prompt once (contiguous cache, batch 1), copy it into fresh blocks, share
  // them with the n samples and sample each one's first token from the last logits.
  void prefill(const std::shared_ptr<Request>& req, int64_t prompt_blocks, int64_t own) {
    const auto& pr = req->r.prompt;
    const int64_t P = static_cast<int64_t>(pr.size()), n = req->r.n;
    std::vector<int32_t> table;
    for (int64_t i = 0; i < prompt_blocks; ++i) table.push_back(take_block());
    KVCache cache = KVCache::create(cfg, 1, P, model->options());
    const auto ids = torch::tensor(std::vector<int64_t>(pr.begin(), pr.end()), torch::kInt64).unsqueeze(0).to(dev);
    const auto h = model->hidden(ids, torch::Tensor(), &cache);
    const auto logits = model->logits(h.narrow(1, P - 1, 1)).squeeze(1);  // [1, V]
    const auto s = slots(table, 0, P);
    for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
      pk[l].index_copy_(0, s, cache.k[l][0].transpose(0, 1));
      pv[l].index_copy_(0, s, cache.v[l][0].transpose(0, 1));
    }
    st.prefill_tokens += P;
    const auto& sp = req->r.sampling;
    const int64_t vv = sp.valid_vocab > 0 ? sp.valid_vocab : cfg.vocab_size;
    auto [tok, lp] = sample_tokens(logits.expand({n, logits.size(1)}), sp, vv, gen);
    const auto th = tok.to(torch::kCPU), lh = lp.to(torch::kCPU);
    reserved += n * own;
    for (int64_t i = 0; i < n; ++i) {
      Seq sq;
      sq.req = req;
      sq.index = i;
      sq.table = table;
      for (int32_t b : table) ++refs[b];
      sq.kv_len = P;
      sq.reserve_left = own;
      running.push_back(std::move(sq));
      if (push_token(running.back(), static_cast<int32_t>(th[i].item<int64_t>()), lh[i].item<float>()))
        finish(running.size() - 1);
    }
    for (int32_t b : table) release_block(b);  // the samples hold the prompt now
  }

  // Appends a sampled token; true when the sequence is done.
  bool push_token(Seq& s, int32_t t, float lp) {
    auto& c = s.req->out[static_cast<std::size_t>(s.index)];
    const auto& p = s.req->r.sampling;
    c.tokens.push_back(t);
    c.logprobs.push_back(lp);
    s.last = t;
    if (std::find(p.eos_ids.begin(), p.eos_ids.end(), int64_t(t)) != p.eos_ids.end())
      c.finish_reason = "eos";
    else if (p.loop_repeats > 0 && loop_period(c.tokens, p) > 0)
      c.finish_reason = "loop";
    else if (static_cast<int64_t>(c.tokens.size()) >= p.max_new_tokens)
      c.finish_reason = "length";
    return !c.finish_reason.empty();
  }

  // Releases sequence i's blocks and reservation; completes its request when it was the
  // last open sample. The sequence is marked by a null request and swept by the caller.
  void finish(std::size_t i) {
    auto& s = running[i];
    for (int32_t b : s.table) release_block(b);
    s.table.clear();
    reserved -= s.reserve_left;
    s.reserve_left = 0;
    auto req = std::move(s.req);
    if (--req->open == 0) {
      EngineResult r;
      r.id = req->r.id;
      r.completions = std::move(req->out);
      r.queued_s = secs(req->submitted, req->admitted);
      r.latency_s = secs(req->submitted, Clock::now());
      finished.push_back(std::move(r));
    }
  }

  void sweep() {
    running.erase(std::remove_if(running.begin(), running.end(), [](const Seq& s) { return !s.req; }), running.end());
  }

  // Blocks for positions [kv_len, kv_len + steps) of sequence s: copy-on-write of a shared
  // block about to be written, fresh blocks from the reservation past the table's end.
  void ensure_blocks(Seq& s, int64_t steps) {
    const int64_t first = s.kv_len / bs, last = (s.kv_len + steps - 1) / bs;
    for (int64_t j = first; j <= last; ++j) {
      if (j < static_cast<int64_t>(s.table.size())) {
        const int32_t b = s.table[static_cast<std::size_t>(j)];
        if (refs[b] == 1) continue;
        // Shared (the prompt's partial block): take a private copy of its filled part.
        if (s.reserve_left <= 0) throw Error("engine: copy-on-write without a reserved block");
        const int32_t nb = take_block();
        --s.reserve_left;
        --reserved;
        const auto src = torch::arange(int64_t(b) * bs, int64_t(b + 1) * bs,
                                       torch::TensorOptions().dtype(torch::kInt64).device(dev));
        const auto dst = src - int64_t(b) * bs + int64_t(nb) * bs;
        for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
          pk[l].index_copy_(0, dst, pk[l].index_select(0, src));
          pv[l].index_copy_(0, dst, pv[l].index_select(0, src));
        }
        release_block(b);
        s.table[static_cast<std::size_t>(j)] = nb;
        ++st.cow_copies;
      } else {
        if (s.reserve_left <= 0) throw Error("engine: a sequence outgrew its reserved blocks");
        s.table.push_back(take_block());
        --s.reserve_left;
        --reserved;
      }
    }
  }

  // One chunk: up to check_every decode steps over the running batch, then the host check.
  void decode_chunk() {
    const int64_t B = static_cast<int64_t>(running.size());
    int64_t C = o.check_every;
    for (const auto& s : running) {
      const auto& c = s.req->out[static_cast<std::size_t>(s.index)];
      C = std::min<int64_t>(C, s.req->r.sampling.max_new_tokens - static_cast<int64_t>(c.tokens.size()));
    }
    C = std::max<int64_t>(C, 1);
    int64_t nb = 1;
    for (auto& s : running) {
      ensure_blocks(s, C);
      nb = std::max<int64_t>(nb, ceil_div(s.kv_len + C, bs));
    }
    const int64_t Bb = bucket_rows(B), NB = blocks_bucket(nb);
    std::vector<int64_t> tok(static_cast<std::size_t>(Bb), 0), pos(static_cast<std::size_t>(Bb), 0),
        table(static_cast<std::size_t>(Bb * NB), 0);
    for (int64_t i = 0; i < B; ++i) {
      const auto& s = running[static_cast<std::size_t>(i)];
      tok[static_cast<std::size_t>(i)] = s.last;
      pos[static_cast<std::size_t>(i)] = s.kv_len;
      for (std::size_t j = 0; j < s.table.size(); ++j) table[static_cast<std::size_t>(i * NB) + j] = s.table[j];
    }
    const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
    const auto tok_h = torch::tensor(tok, i64), pos_h = torch::tensor(pos, i64);
    const auto table_h = torch::tensor(table, i64).view({Bb, NB});
    Work local;
    Work& w = use_graphs() ? work_for(Bb, NB) : local;
    if (!w.tok.defined()) {
      w.tok = tok_h.to(dev);
      w.pos = pos_h.to(dev);
      w.table = table_h.to(dev);
    } else {
      w.tok.copy_(tok_h);
      w.pos.copy_(pos_h);
      w.table.copy_(table_h);
    }
    // The working copy: every row's blocks in logical order, gathered once per chunk.
    const auto gidx = (w.table.unsqueeze(2) * bs + torch::arange(bs, w.table.options()).view({1, 1, bs})).reshape({-1});
    const bool fresh = w.kb.empty();
    for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
      if (fresh) {
        w.kb.push_back(pk[l].index_select(0, gidx));
        w.vb.push_back(pv[l].index_select(0, gidx));
      } else {
        at::index_select_out(w.kb[l], pk[l], 0, gidx);
        at::index_select_out(w.vb[l], pv[l], 0, gidx);
      }
    }
    auto out_tok = torch::empty({C, B}, i64.device(dev));
    auto out_lp = torch::empty({C, B}, torch::TensorOptions().dtype(torch::kFloat32).device(dev));
    // One sampling call per distinct sampling setting (usually one for the whole batch).
    std::vector<std::pair<const SamplingParams*, std::vector<int64_t>>> parts;
    for (int64_t i = 0; i < B; ++i) {
      const auto* p = &running[static_cast<std::size_t>(i)].req->r.sampling;
      auto it = std::find_if(parts.begin(), parts.end(), [&](const auto& q) {
        return q.first->temperature == p->temperature && q.first->top_k == p->top_k && q.first->top_p == p->top_p &&
               q.first->valid_vocab == p->valid_vocab;
      });
      if (it == parts.end())
        parts.push_back({p, {i}});
      else
        it->second.push_back(i);
    }
    std::vector<torch::Tensor> part_idx;
    for (const auto& [p, rows] : parts) part_idx.push_back(torch::tensor(rows, i64).to(dev));
    for (int64_t c = 0; c < C; ++c) {
      const auto logits = run_step(w).narrow(0, 0, B);
      if (parts.size() == 1) {
        const auto* p = parts[0].first;
        auto [t, lp] = sample_tokens(logits, *p, p->valid_vocab > 0 ? p->valid_vocab : cfg.vocab_size, gen);
        out_tok[c].copy_(t);
        out_lp[c].copy_(lp);
      } else {
        for (std::size_t k = 0; k < parts.size(); ++k) {
          const auto* p = parts[k].first;
          auto [t, lp] = sample_tokens(logits.index_select(0, part_idx[k]), *p,
                                       p->valid_vocab > 0 ? p->valid_vocab : cfg.vocab_size, gen);
          out_tok[c].index_copy_(0, part_idx[k], t);
          out_lp[c].index_copy_(0, part_idx[k], lp);
        }
      }
      w.tok.narrow(0, 0, B).copy_(out_tok[c]);
      w.pos.add_(1);
      ++st.decode_steps;
      st.decode_rows += B;
      st.padded_rows += Bb - B;
    }
    const auto th = out_tok.to(torch::kCPU), lh = out_lp.to(torch::kCPU);
    const auto ta = th.accessor<int64_t, 2>();
    const auto la = lh.accessor<float, 2>();
    for (int64_t i = 0; i < B; ++i) {
      auto& s = running[static_cast<std::size_t>(i)];
      s.kv_len += C;
      for (int64_t c = 0; c < C; ++c)
        if (push_token(s, static_cast<int32_t>(ta[c][i]), la[c][i])) {
          finish(static_cast<std::size_t>(i));
          break;
        }
    }
    sweep();
  }
};

Engine::Engine(CausalLM model, EngineOptions opts) : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.model = std::move(model);
  m.o = std::move(opts);
  m.cfg = m.model->config();
  m.dev = m.model->options().device();
  m.bs = m.o.block_size;
  auto& o = m.o;
  if (o.block_size < 1) throw Error("actors.engine.block_size must be >= 1, not " + std::to_string(o.block_size));
  if (o.max_sequences < 1)
    throw Error("actors.engine.max_sequences must be >= 1, not " + std::to_string(o.max_sequences));
  if (o.check_every < 1) throw Error("engine: check_every must be >= 1");
  if (o.kv_budget_mb < 1) throw Error("actors.engine.kv_budget_mb must be >= 1, not " + std::to_string(o.kv_budget_mb));
  if (o.batch_buckets.empty())
    for (int64_t b = 1;; b *= 2) {
      o.batch_buckets.push_back(std::min(b, o.max_sequences));
      if (b >= o.max_sequences) break;
    }
  for (std::size_t i = 1; i < o.batch_buckets.size(); ++i)
    if (o.batch_buckets[i] <= o.batch_buckets[i - 1]) throw Error("engine: batch_buckets must ascend");
  const auto& c = m.cfg;
  const int64_t elem = static_cast<int64_t>(torch::elementSize(m.model->options().dtype().toScalarType()));
  m.st.block_bytes = c.num_hidden_layers * 2 * m.bs * c.num_key_value_heads * c.head_dim * elem;
  const int64_t blocks = o.kv_budget_mb * 1024 * 1024 / m.st.block_bytes;
  if (blocks < 2)
    throw Error("actors.engine.kv_budget_mb " + std::to_string(o.kv_budget_mb) + " holds " + std::to_string(blocks) +
                " KV blocks of " + std::to_string(m.st.block_bytes) + " bytes; the engine needs at least 2");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    m.pk.push_back(torch::zeros({blocks * m.bs, c.num_key_value_heads, c.head_dim}, m.model->options()));
    m.pv.push_back(torch::zeros({blocks * m.bs, c.num_key_value_heads, c.head_dim}, m.model->options()));
  }
  m.refs.assign(static_cast<std::size_t>(blocks), 0);
  m.refs[0] = 1;  // the scratch block of padding rows, never handed out
  for (int64_t b = blocks - 1; b >= 1; --b) m.free_list.push_back(static_cast<int32_t>(b));
  m.st.blocks_total = blocks - 1;
  m.gen = at::globalContext().defaultGenerator(m.dev).clone();
  m.gen.set_current_seed(o.seed);
}

Engine::~Engine() = default;

const EngineOptions& Engine::options() const { return impl_->o; }

bool Engine::idle() const { return impl_->waiting.empty() && impl_->running.empty() && impl_->finished.empty(); }

EngineStats Engine::stats() const {
  auto s = impl_->st;
  s.blocks_free = static_cast<int64_t>(impl_->free_list.size());
  s.blocks_peak_used = impl_->peak_used;
  s.waiting = static_cast<int64_t>(impl_->waiting.size());
  s.running_sequences = static_cast<int64_t>(impl_->running.size());
  std::vector<const void*> reqs;
  for (const auto& q : impl_->running)
    if (std::find(reqs.begin(), reqs.end(), q.req.get()) == reqs.end()) reqs.push_back(q.req.get());
  s.running_requests = static_cast<int64_t>(reqs.size());
  return s;
}

void Engine::submit(EngineRequest r) {
  auto& m = *impl_;
  m.validate(r);
  const auto [prompt_blocks, own] = m.need_blocks(r);
  const int64_t need = prompt_blocks + r.n * own;
  if (need > m.st.blocks_total)
    throw Error("engine: request " + std::to_string(r.id) + " (prompt " + std::to_string(r.prompt.size()) +
                " tokens, n " + std::to_string(r.n) + ", max_new_tokens " + std::to_string(r.sampling.max_new_tokens) +
                ") needs " + std::to_string(need) + " KV blocks (" +
                std::to_string(ceil_div(need * m.st.block_bytes, 1024 * 1024)) +
                " MB) but actors.engine.kv_budget_mb holds " + std::to_string(m.st.blocks_total) + " blocks");
  auto req = std::make_shared<Impl::Request>();
  req->r = std::move(r);
  req->submitted = Clock::now();
  m.waiting.push_back(std::move(req));
}

std::vector<EngineResult> Engine::step() {
  auto& m = *impl_;
  torch::NoGradGuard no_grad;
  GpuShare::Scope share(m.o.gpu_share);
#ifdef KF_POLICY_CUDA
  // Graph capture needs a non-default stream: the engine works on one of its own.
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (m.dev.is_cuda() && m.o.cuda_graph) {
    if (!m.stream)
      m.stream = c10::cuda::getStreamFromPool(false, m.dev.index() < 0 ? c10::cuda::current_device() : m.dev.index());
    torch::cuda::synchronize();
    guard.emplace(*m.stream);
  }
#endif
  while (m.finished.empty() && !(m.waiting.empty() && m.running.empty())) {
    while (!m.waiting.empty() && m.admit_one()) {
    }
    m.sweep();  // sequences that ended on their first token
    if (m.running.empty()) {
      if (m.waiting.empty() || !m.finished.empty()) break;
      throw Error("engine: the head request cannot be admitted into an empty pool");
    }
    m.decode_chunk();
    if (m.o.gpu_share) m.o.gpu_share->pause_point();
  }
#ifdef KF_POLICY_CUDA
  if (guard) torch::cuda::synchronize();
#endif
  return std::exchange(m.finished, {});
}

std::vector<EngineResult> Engine::run_all() {
  std::vector<EngineResult> all;
  while (!idle()) {
    auto r = step();
    for (auto& x : r) all.push_back(std::move(x));
  }
  return all;
}

}  // namespace kf::policy
