#include "kf/actors/group_sampler.h"

#include <algorithm>

#include "kf/common/error.h"

namespace kf::actors {

std::vector<policy::Completion> sample_group(policy::CausalLM& model, const std::vector<int32_t>& prompt, int64_t G,
                                             const policy::SamplingParams& p, int64_t valid_vocab,
                                             bool shared_prefill) {
  if (G < 1) throw Error("sample_group: group size must be >= 1");
  if (prompt.empty()) throw Error("sample_group: empty prompt");
  if (p.max_new_tokens <= 0) throw Error("sample_group: max_new_tokens must be positive");
  if (!p.stop.empty()) throw Error("sample_group: stop strings are not supported (use eos_ids)");
  if (!shared_prefill) {
    policy::SamplingParams q = p;
    q.valid_vocab = valid_vocab;
    policy::Sampler s(model, nullptr);
    return s.generate(std::vector<std::vector<int32_t>>(static_cast<std::size_t>(G), prompt), q);
  }
  torch::NoGradGuard no_grad;
  const auto& cfg = model->config();
  const auto opts = model->options();
  const auto dev = opts.device();
  const int64_t L = static_cast<int64_t>(prompt.size());
  for (int32_t t : prompt)
    if (t < 0 || t >= cfg.vocab_size) throw Error("sample_group: prompt token " + std::to_string(t) + " outside the vocab");
  const int64_t cap = L + p.max_new_tokens;

  policy::GpuShare::Scope share(p.gpu_share);  // GPU work from here on; paused at each host check
  // Prefill once.
  auto ids = torch::from_blob(const_cast<int32_t*>(prompt.data()), {1, L}, torch::kInt32).to(torch::kInt64);
  policy::KVCache one = policy::KVCache::create(cfg, 1, cap, opts);
  auto h = model->hidden(ids.to(dev), torch::Tensor(), &one);
  auto logits = model->logits(h.narrow(1, L - 1, 1)).squeeze(1).repeat({G, 1});
  // Replicate the cache for the G rows.
  policy::KVCache cache;
  cache.capacity = cap;
  cache.length = one.length;
  for (std::size_t l = 0; l < one.k.size(); ++l) {
    cache.k.push_back(one.k[l].repeat({G, 1, 1, 1}));
    cache.v.push_back(one.v[l].repeat({G, 1, 1, 1}));
  }
  cache.slot_valid = one.slot_valid.repeat({G, 1});
  cache.next_pos = one.next_pos.repeat({G});
  one = policy::KVCache();

  auto gen = at::globalContext().defaultGenerator(dev).clone();
  gen.set_current_seed(p.seed);
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(dev);
  auto out_tok = torch::zeros({G, p.max_new_tokens}, i64);
  auto out_lp = torch::zeros({G, p.max_new_tokens}, opts.dtype(torch::kFloat32));
  std::vector<policy::Completion> res(static_cast<std::size_t>(G));
  std::vector<bool> done(static_cast<std::size_t>(G), false);
  int64_t steps = 0, checked = 0;
  auto check = [&](int64_t upto) {
    const auto toks = out_tok.narrow(1, 0, upto).to(torch::kCPU);
    const auto lps = out_lp.narrow(1, 0, upto).to(torch::kCPU);
    const auto ta = toks.accessor<int64_t, 2>();
    const auto la = lps.accessor<float, 2>();
    bool all = true;
    for (int64_t b = 0; b < G; ++b) {
      auto& c = res[b];
      for (int64_t i = checked; i < upto && !done[b]; ++i) {
        c.tokens.push_back(static_cast<int32_t>(ta[b][i]));
        c.logprobs.push_back(la[b][i]);
        if (std::find(p.eos_ids.begin(), p.eos_ids.end(), ta[b][i]) != p.eos_ids.end()) {
          done[b] = true;
          c.finish_reason = "eos";
        }
      }
      if (!done[b] && upto == p.max_new_tokens) {
        done[b] = true;
        c.finish_reason = "length";
      }
      all = all && done[b];
    }
    checked = upto;
    return all;
  };
  const int64_t every = std::max<int64_t>(1, p.check_every);
  while (true) {
    auto [tok, lp] = policy::sample_tokens(logits, p, valid_vocab, gen);
    out_tok.select(1, steps).copy_(tok);
    out_lp.select(1, steps).copy_(lp);
    ++steps;
    if (steps == p.max_new_tokens || steps % every == 0) {
      if (check(steps)) break;
      if (p.gpu_share) p.gpu_share->pause_point();
    }
    h = model->hidden(tok.unsqueeze(1), torch::Tensor(), &cache);
    logits = model->logits(h).squeeze(1);
  }
  return res;
}

}  // namespace kf::actors
