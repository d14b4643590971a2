#include "kf/policy/model.h"

#include <cmath>

#include "kf/common/error.h"

namespace kf::policy {

LinearImpl::LinearImpl(int64_t in, int64_t out, bool has_bias, torch::TensorOptions opts) {
  weight = register_parameter("weight", torch::empty({out, in}, opts));
  if (has_bias) bias = register_parameter("bias", torch::zeros({out}, opts));
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight, bias); }

EmbeddingImpl::EmbeddingImpl(int64_t vocab, int64_t dim, torch::TensorOptions opts) {
  weight = register_parameter("weight", torch::empty({vocab, dim}, opts));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) { return torch::embedding(weight, ids); }

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_, torch::TensorOptions opts) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}, opts));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // HF: variance in fp32, cast back to the input dtype, then scale by the weight.
  const auto xf = x.to(torch::kFloat32);
  const auto var = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * torch::rsqrt(var + eps)).to(x.scalar_type());
}

namespace {

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& r) {
  // x [B, heads, T, D]; tables [B, T, D] broadcast over heads.
  const auto cos = r.cos.unsqueeze(1), sin = r.sin.unsqueeze(1);
  return x * cos + rotate_half(x) * sin;
}

// inv_freq exactly as HF computes it (fp32 pow), including linear and llama3 scaling.
torch::Tensor make_inv_freq(const ModelConfig& c) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const auto exponents = torch::arange(0, c.head_dim, 2, torch::TensorOptions().dtype(torch::kInt64)).to(torch::kFloat32) /
                         static_cast<double>(c.head_dim);
  auto inv = 1.0 / torch::pow(torch::scalar_tensor(c.rope.theta, f32), exponents);
  if (c.rope.type == "linear") {
    inv = inv / c.rope.factor;
  } else if (c.rope.type == "llama3") {
    const double old_len = static_cast<double>(c.rope.original_max_position);
    const double low_wavelen = old_len / c.rope.low_freq_factor, high_wavelen = old_len / c.rope.high_freq_factor;
    const auto wavelen = 2 * M_PI / inv;
    auto scaled = torch::where(wavelen > low_wavelen, inv / c.rope.factor, inv);
    const auto smooth = (old_len / wavelen - c.rope.low_freq_factor) / (c.rope.high_freq_factor - c.rope.low_freq_factor);
    const auto smoothed = (1 - smooth) * scaled / c.rope.factor + smooth * scaled;
    const auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv = torch::where(medium, smoothed, scaled);
  }
  return inv;
}

}  // namespace

AttentionImpl::AttentionImpl(const ModelConfig& c, torch::TensorOptions opts)
    : heads(c.num_attention_heads), kv_heads(c.num_key_value_heads), head_dim(c.head_dim) {
  q_proj = register_module("q_proj", Linear(c.hidden_size, heads * head_dim, c.qkv_bias, opts));
  k_proj = register_module("k_proj", Linear(c.hidden_size, kv_heads * head_dim, c.qkv_bias, opts));
  v_proj = register_module("v_proj", Linear(c.hidden_size, kv_heads * head_dim, c.qkv_bias, opts));
  o_proj = register_module("o_proj", Linear(heads * head_dim, c.hidden_size, c.o_bias, opts));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RopeTables& rope, const torch::Tensor& mask,
                                     KVCache* cache, int64_t layer) {
  const int64_t B = x.size(0), T = x.size(1);
  auto q = q_proj(x).view({B, T, heads, head_dim}).transpose(1, 2);
  auto k = k_proj(x).view({B, T, kv_heads, head_dim}).transpose(1, 2);
  auto v = v_proj(x).view({B, T, kv_heads, head_dim}).transpose(1, 2);
  q = apply_rope(q, rope);
  k = apply_rope(k, rope);
  if (cache && cache->static_slot.defined()) {
    cache->k[layer].index_copy_(2, cache->static_slot, k);
    cache->v[layer].index_copy_(2, cache->static_slot, v);
    k = cache->k[layer];
    v = cache->v[layer];
  } else if (cache) {
    const int64_t start = cache->length;
    cache->k[layer].narrow(2, start, T).copy_(k);
    cache->v[layer].narrow(2, start, T).copy_(v);
    k = cache->k[layer].narrow(2, 0, start + T);
    v = cache->v[layer].narrow(2, 0, start + T);
  }
  std::optional<torch::Tensor> m;
  if (mask.defined()) m = mask;
  const int64_t groups = heads / kv_heads;
  torch::Tensor o;
  if (T == 1 && groups > 1) {
    // Decode: the G query heads sharing a KV head become G queries of one head (same
    // position, so the key mask broadcasts): no copy of the cache, any SDPA backend.
    auto qg = q.reshape({B, kv_heads, groups, head_dim});
    o = at::scaled_dot_product_attention(qg, k, v, m, 0.0, false).reshape({B, heads, 1, head_dim});
  } else {
    // Prefill/training: expand K/V to all heads so the flash/memory-efficient kernels apply
    // (SDPA's enable_gqa is not supported by all of them).
    if (groups > 1) {
      k = k.repeat_interleave(groups, 1);
      v = v.repeat_interleave(groups, 1);
    }
    o = at::scaled_dot_product_attention(q, k, v, m, 0.0, /*is_causal=*/!mask.defined());
  }
  return o_proj(o.transpose(1, 2).reshape({B, T, heads * head_dim}));
}

MLPImpl::MLPImpl(const ModelConfig& c, torch::TensorOptions opts) {
  gate_proj = register_module("gate_proj", Linear(c.hidden_size, c.intermediate_size, c.mlp_bias, opts));
  up_proj = register_module("up_proj", Linear(c.hidden_size, c.intermediate_size, c.mlp_bias, opts));
  down_proj = register_module("down_proj", Linear(c.intermediate_size, c.hidden_size, c.mlp_bias, opts));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) { return down_proj(torch::silu(gate_proj(x)) * up_proj(x)); }

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, torch::TensorOptions opts) {
  self_attn = register_module("self_attn", Attention(c, opts));
  mlp = register_module("mlp", MLP(c, opts));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, opts));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, opts));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const RopeTables& rope, const torch::Tensor& mask,
                                        KVCache* cache, int64_t layer) {
  auto h = x + self_attn(input_layernorm(x), rope, mask, cache, layer);
  return h + mlp(post_attention_layernorm(h));
}

BackboneImpl::BackboneImpl(const ModelConfig& c, torch::TensorOptions opts) {
  embed_tokens = register_module("embed_tokens", Embedding(c.vocab_size, c.hidden_size, opts));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(DecoderLayer(c, opts));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps, opts));
}

KVCache KVCache::create(const ModelConfig& c, int64_t batch, int64_t capacity, torch::TensorOptions opts) {
  KVCache kv;
  kv.capacity = capacity;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    kv.k.push_back(torch::zeros({batch, c.num_key_value_heads, capacity, c.head_dim}, opts));
    kv.v.push_back(torch::zeros({batch, c.num_key_value_heads, capacity, c.head_dim}, opts));
  }
  kv.slot_valid = torch::zeros({batch, capacity}, opts.dtype(torch::kBool));
  kv.next_pos = torch::zeros({batch}, opts.dtype(torch::kInt64));
  return kv;
}

CausalLMImpl::CausalLMImpl(const ModelConfig& c, torch::TensorOptions opts) : config_(c), opts_(opts) {
  c.validate("model config");
  model = register_module("model", Backbone(c, opts));
  if (!c.tie_word_embeddings) lm_head = register_module("lm_head", Linear(c.hidden_size, c.vocab_size, false, opts));
  inv_freq_ = make_inv_freq(c).to(opts.device());
}

RopeTables CausalLMImpl::rope(const torch::Tensor& positions) const {
  // fp32 angles (HF autocasts them off), then cast to the compute dtype.
  const auto freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq_;  // [B, T, D/2]
  const auto emb = torch::cat({freqs, freqs}, -1);
  return RopeTables{emb.cos().to(opts_.dtype()), emb.sin().to(opts_.dtype())};
}

namespace {

// Reentrant activation checkpointing of one decoder layer: forward keeps only the layer
// input; backward re-runs the layer with grad enabled and back-propagates through it
// (parameter gradients accumulate in .grad, as with PyTorch's use_reentrant=True).
struct LayerCheckpoint : public torch::autograd::Function<LayerCheckpoint> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor cos,
                               torch::Tensor sin, torch::Tensor mask, int64_t layer_ptr) {
    ctx->saved_data["layer"] = layer_ptr;
    ctx->saved_data["mask"] = mask;
    ctx->save_for_backward({x, cos, sin});
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(layer_ptr);
    return layer->forward(x, RopeTables{cos, sin}, mask, nullptr, 0);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    const torch::Tensor mask = ctx->saved_data["mask"].isTensor() ? ctx->saved_data["mask"].toTensor() : torch::Tensor();
    auto x = saved[0].detach().requires_grad_(true);
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = layer->forward(x, RopeTables{saved[1], saved[2]}, mask, nullptr, 0);
    }
    torch::autograd::backward({out}, {grads[0]});
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor CausalLMImpl::hidden(const torch::Tensor& ids, const torch::Tensor& attention_mask, KVCache* cache) {
  TORCH_CHECK(ids.dim() == 2, "ids must be [batch, time]");
  const int64_t B = ids.size(0), T = ids.size(1);
  const auto dev = opts_.device();
  const auto ids_d = ids.to(dev, torch::kInt64);
  torch::Tensor am;
  if (attention_mask.defined()) am = attention_mask.to(dev).to(torch::kBool);
  torch::Tensor positions, mask;
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(dev);
  if (cache) {
    const int64_t start = cache->length, keys = start + T;
    if (keys > cache->capacity)
      throw Error("KV cache: " + std::to_string(keys) + " tokens exceed its capacity " + std::to_string(cache->capacity));
    if (am.defined()) {
      cache->slot_valid.narrow(1, start, T).copy_(am);
      positions = cache->next_pos.unsqueeze(1) + (am.to(torch::kInt64).cumsum(1) - 1).clamp_min(0);
      cache->next_pos.add_(am.to(torch::kInt64).sum(1));
    } else {
      cache->slot_valid.narrow(1, start, T).fill_(true);
      positions = cache->next_pos.unsqueeze(1) + torch::arange(T, i64).unsqueeze(0);
      cache->next_pos.add_(T);
    }
    // Query t (slot start+t) sees valid slots <= start+t, and always itself, so a padding
    // query never has an empty row (which would give NaN).
    const auto q_slot = torch::arange(start, keys, i64).unsqueeze(1);
    const auto k_slot = torch::arange(keys, i64).unsqueeze(0);
    auto allowed = (k_slot <= q_slot).unsqueeze(0) & cache->slot_valid.narrow(1, 0, keys).unsqueeze(1);
    allowed = allowed | (k_slot == q_slot).unsqueeze(0);
    mask = allowed.unsqueeze(1);  // [B, 1, T, keys]
  } else if (am.defined()) {
    positions = (am.to(torch::kInt64).cumsum(1) - 1).clamp_min(0);
    const auto t = torch::arange(T, i64);
    auto allowed = (t.unsqueeze(0) <= t.unsqueeze(1)).unsqueeze(0) & am.unsqueeze(1);
    allowed = allowed | torch::eye(T, i64.dtype(torch::kBool)).unsqueeze(0);
    mask = allowed.unsqueeze(1);
  } else {
    positions = torch::arange(T, i64).unsqueeze(0).expand({B, T});
  }
  const RopeTables r = rope(positions);
  auto x = model->embed_tokens(ids_d);
  const bool ckpt = checkpointing_ && !cache && torch::GradMode::is_enabled();
  for (int64_t l = 0; l < static_cast<int64_t>(model->layers->size()); ++l) {
    auto* layer = model->layers[l]->as<DecoderLayerImpl>();
    if (ckpt) x = LayerCheckpoint::apply(x, r.cos, r.sin, mask, reinterpret_cast<int64_t>(layer));
    else x = layer->forward(x, r, mask, cache, l);
  }
  if (cache) cache->length += T;
  return model->norm(x);
}

torch::Tensor CausalLMImpl::decode_static(const torch::Tensor& tok, KVCache& cache) {
  TORCH_CHECK(cache.static_slot.defined(), "decode_static needs cache.static_slot");
  const int64_t B = tok.size(0), cap = cache.capacity;
  const auto positions = cache.next_pos.unsqueeze(1).clone();
  cache.next_pos.add_(1);
  cache.slot_valid.index_fill_(1, cache.static_slot, true);
  const auto k_slot = torch::arange(cap, cache.next_pos.options()).unsqueeze(0);
  const auto mask = (cache.slot_valid & (k_slot <= cache.static_slot)).view({B, 1, 1, cap});
  const RopeTables r = rope(positions);
  auto x = model->embed_tokens(tok);
  for (int64_t l = 0; l < static_cast<int64_t>(model->layers->size()); ++l)
    x = model->layers[l]->as<DecoderLayerImpl>()->forward(x, r, mask, &cache, l);
  return logits(model->norm(x)).squeeze(1);
}

torch::Tensor CausalLMImpl::logits(const torch::Tensor& h) {
  return lm_head ? lm_head(h) : torch::nn::functional::linear(h, model->embed_tokens->weight);
}

torch::Tensor CausalLMImpl::forward(const torch::Tensor& ids, const torch::Tensor& attention_mask) {
  return logits(hidden(ids, attention_mask, nullptr));
}

torch::Tensor CausalLMImpl::token_logprobs(const torch::Tensor& ids, const torch::Tensor& attention_mask,
                                           double temperature) {
  TORCH_CHECK(ids.size(1) >= 2, "token_logprobs needs at least two tokens per row");
  TORCH_CHECK(temperature > 0, "temperature must be positive");
  const int64_t T = ids.size(1);
  const auto h = hidden(ids, attention_mask, nullptr).narrow(1, 0, T - 1);
  auto z = logits(h).to(torch::kFloat32);
  if (temperature != 1.0) z = z / temperature;
  const auto target = ids.to(z.device(), torch::kInt64).narrow(1, 1, T - 1).unsqueeze(-1);
  auto lp = z.gather(-1, target).squeeze(-1) - torch::logsumexp(z, -1);
  if (attention_mask.defined()) lp = lp * attention_mask.to(lp.device()).narrow(1, 1, T - 1).to(lp.scalar_type());
  return lp;
}

void CausalLMImpl::init_random(uint64_t seed, double std) {
  torch::NoGradGuard no_grad;
  auto gen = at::globalContext().defaultGenerator(opts_.device()).clone();
  gen.set_current_seed(seed);
  for (auto& p : named_parameters()) {
    const std::string& n = p.key();
    auto& t = p.value();
    if (n.find("norm") != std::string::npos) t.fill_(1.0);
    else if (n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0) t.zero_();
    else t.normal_(0.0, std, gen);
  }
}

}  // namespace kf::policy
