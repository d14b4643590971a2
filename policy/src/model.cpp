// CausalLM and its parts (kf/policy/policy.h, policy/src/layers.h): the decoder's modules,
// the memory-lean layer functions (custom autograd nodes), the KV cache, LoRA, packed
// sequences, gradient checkpointing and the ParamHooks calls.
// ParamHooks order: pre_forward(l) before decoder layer l runs forward (l = -1: the
// embeddings, final norm and head, which hidden() and hidden_packed() need from their
// start); post_forward(l) after it (the owner may free layer l's full weights; autograd's
// saved references keep the tensors, whose storage the owner refills before backward);
// pre_backward(l) before layer l's backward: inside LayerCheckpoint's backward
// (recomputation) before the layer is re-run, else from a hook on the layer output's
// gradient. Freeing after backward is the owner's (when the layer's gradients are in).
#include "kf/policy/policy.h"

#include <ATen/SDPBackend.h>
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "kf/common/error.h"
#include "layers.h"

namespace kf::policy {

LinearImpl::LinearImpl(int64_t in, int64_t out, bool has_bias, torch::TensorOptions opts) {
  weight = register_parameter("weight", torch::empty({out, in}, opts));
  if (has_bias) bias = register_parameter("bias", torch::zeros({out}, opts));
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  auto y = torch::nn::functional::linear(x, weight, bias);
  if (!adapted()) return y;
  return y + adapter(x, y.scalar_type());
}

torch::Tensor LinearImpl::adapter(const torch::Tensor& x, at::ScalarType out) {
  // Unmerged: the adapter path runs beside the frozen projection. fp32 adapters on a bf16
  // base cast the input to theirs, except under autocast: both matmuls run in bf16 there
  // anyway, and an fp32 copy would be cast back and kept for backward, a second copy of
  // every adapted projection's input beside the one the base projection keeps.
  const bool autocast = at::autocast::is_autocast_enabled(x.device().type());
  const auto xa = autocast || x.scalar_type() == lora_A->weight.scalar_type() ? x : x.to(lora_A->weight.scalar_type());
  const auto d = torch::nn::functional::linear(torch::nn::functional::linear(xa, lora_A->weight), lora_B->weight);
  return (d * lora_scale).to(out);
}

void LinearImpl::add_lora(int64_t rank, double scale, torch::TensorOptions opts, at::Generator& gen) {
  TORCH_CHECK(!lora_A, "add_lora: this projection already has adapters");
  const int64_t in = weight.size(1), out = weight.size(0);
  lora_A = register_module("lora_A", std::make_shared<LinearImpl>(in, rank, false, opts));
  lora_B = register_module("lora_B", std::make_shared<LinearImpl>(rank, out, false, opts));
  torch::NoGradGuard ng;
  // PEFT's default: kaiming_uniform_(a=sqrt(5)) on A, i.e. U(-1/sqrt(in), 1/sqrt(in)); B = 0.
  // Drawn on the CPU from `gen`, so every device gets the same adapters.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  lora_A->weight.copy_(torch::empty({rank, in}, torch::kFloat32).uniform_(-bound, bound, gen));
  lora_B->weight.zero_();
  lora_scale = scale;
  weight.set_requires_grad(false);
  if (bias.defined()) bias.set_requires_grad(false);
}

bool is_lora_param(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

EmbeddingImpl::EmbeddingImpl(int64_t vocab, int64_t dim, torch::TensorOptions opts) {
  weight = register_parameter("weight", torch::empty({vocab, dim}, opts));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) { return torch::embedding(weight, ids); }

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_, torch::TensorOptions opts) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}, opts));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return rms_norm(x, weight, eps); }

namespace {

bool records_grad(std::initializer_list<const torch::Tensor*> ts) {
  if (!torch::GradMode::is_enabled()) return false;
  for (const auto* t : ts)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

// HF: variance in fp32, cast back to the input dtype, then scale by the weight.
torch::Tensor rms_norm_plain(const torch::Tensor& x, const torch::Tensor& w, double eps, torch::Tensor* rstd_out) {
  const auto xf = x.to(torch::kFloat32);
  const auto rstd = torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (rstd_out) *rstd_out = rstd;
  return w * (xf * rstd).to(x.scalar_type());
}

// Backward of each op of rms_norm_plain in turn, with the dtype casts autograd makes
// between them (a gradient takes its input's dtype), so the result matches the plain
// expression's gradient to rounding.
struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               double eps) {
    torch::Tensor rstd;
    auto y = rms_norm_plain(x, w, eps, &rstd);
    ctx->save_for_backward({x, w, rstd});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &rstd = saved[2];
    const auto& g = grads[0];
    const auto xf = x.to(torch::kFloat32);
    const auto n = (xf * rstd).to(x.scalar_type());
    torch::Tensor gw;
    if (ctx->needs_input_grad(1)) gw = at::sum_to(g * n, w.sizes()).to(w.scalar_type());
    torch::Tensor gx;
    if (ctx->needs_input_grad(0)) {
      const auto g_hat = (g * w).to(x.scalar_type()).to(torch::kFloat32);
      const auto g_rstd = (g_hat * xf).sum(-1, /*keepdim=*/true);
      const auto g_var = g_rstd * -0.5 * rstd.pow(3);
      const auto g_sq = g_var.expand_as(xf) / static_cast<double>(xf.size(-1));
      gx = (g_hat * rstd + g_sq * (xf * 2)).to(x.scalar_type());
    }
    return {gx, gw, torch::Tensor()};
  }
};

// The autocast state of a device type, recorded in forward and re-entered in backward:
// autocast is per thread, and backward runs on the autograd engine's thread.
struct AutocastState {
  c10::DeviceType device = c10::DeviceType::CPU;
  bool on = false;
  at::ScalarType dtype = at::kFloat;
  static AutocastState of(c10::DeviceType dt) {
    AutocastState a;
    a.device = dt;
    a.on = (dt == c10::DeviceType::CUDA || dt == c10::DeviceType::CPU) && at::autocast::is_autocast_enabled(dt);
    if (a.on) a.dtype = at::autocast::get_autocast_dtype(dt);
    return a;
  }
  void save(torch::autograd::AutogradContext* ctx) const {
    ctx->saved_data["autocast_device"] = static_cast<int64_t>(device);
    ctx->saved_data["autocast"] = on;
    ctx->saved_data["autocast_dtype"] = static_cast<int64_t>(dtype);
  }
  static AutocastState load(torch::autograd::AutogradContext* ctx) {
    AutocastState a;
    a.device = static_cast<c10::DeviceType>(ctx->saved_data["autocast_device"].toInt());
    a.on = ctx->saved_data["autocast"].toBool();
    a.dtype = static_cast<at::ScalarType>(ctx->saved_data["autocast_dtype"].toInt());
    return a;
  }
};

// Enters a recorded autocast state for one scope and restores the thread's own after it,
// even if the scope throws. A state with autocast off changes nothing.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& a) : a_(a) {
    if (!a_.on) return;
    was_ = at::autocast::is_autocast_enabled(a_.device);
    was_dtype_ = at::autocast::get_autocast_dtype(a_.device);
    at::autocast::set_autocast_enabled(a_.device, true);
    at::autocast::set_autocast_dtype(a_.device, a_.dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!a_.on) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(a_.device, was_);
    at::autocast::set_autocast_dtype(a_.device, was_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState a_;
  bool was_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

// down(silu(gate) * up), keeping gate and up only. Backward recomputes the product (cheap,
// elementwise) and back-propagates by hand through down's matmul (no second forward
// matmul) and the product, the op sequence autograd would run; only down's adapters go
// through autograd, which accumulates their gradients into their .grad as a reentrant
// checkpoint does. weight and bias are inputs so that their gradients, when they need them,
// go through autograd's own accumulation; an empty bias stands for none.
struct SwigluDownFn : public torch::autograd::Function<SwigluDownFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up, const torch::Tensor& weight, const torch::Tensor& bias,
                               int64_t down_ptr) {
    auto* down = reinterpret_cast<LinearImpl*>(down_ptr);
    ctx->saved_data["down"] = down_ptr;
    AutocastState::of(gate.device().type()).save(ctx);
    ctx->save_for_backward({gate, up, weight});
    return down->forward(torch::silu(gate) * up);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &gate = saved[0], &up = saved[1], &weight = saved[2];
    auto* down = reinterpret_cast<LinearImpl*>(ctx->saved_data["down"].toInt());
    const auto state = AutocastState::load(ctx);
    const auto& gy = grads[0];
    const bool need_p = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    auto p = torch::silu(gate) * up;
    torch::Tensor g_p, g_weight, g_bias;
    // The matmul ran in the autocast dtype when autocast was on, on a cast of the weight.
    const auto g2 = gy.reshape({-1, gy.size(-1)});
    if (need_p) g_p = at::matmul(gy, state.on ? weight.to(state.dtype) : weight).to(p.scalar_type());
    if (ctx->needs_input_grad(2))
      g_weight = g2.t().mm(p.reshape({-1, p.size(-1)}).to(g2.scalar_type())).to(weight.scalar_type());
    if (ctx->needs_input_grad(3) && down->bias.defined()) g_bias = g2.sum(0).to(down->bias.scalar_type());
    if (down->adapted()) {
      auto leaf = p.detach().requires_grad_(need_p);
      torch::Tensor d;
      {
        torch::AutoGradMode enable(true);
        AutocastScope scope(state);  // the adapter's matmuls as in forward; backward outside it
        d = down->adapter(leaf, gy.scalar_type());
      }
      if (d.requires_grad()) torch::autograd::backward({d}, {gy});
      if (need_p && leaf.grad().defined()) g_p.add_(leaf.grad());
    }
    p = torch::Tensor();
    torch::Tensor g_gate, g_up;
    if (ctx->needs_input_grad(1)) g_up = g_p * torch::silu(gate);
    if (ctx->needs_input_grad(0)) g_gate = at::silu_backward(g_p * up, gate);
    return {g_gate, g_up, g_weight, g_bias, torch::Tensor()};
  }
};

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// The adjoint of rotate_half: rotate_half(y) = [-y2, y1], so a gradient [z1, z2] gives [z2, -z1].
torch::Tensor rotate_half_adjoint(const torch::Tensor& z) {
  const int64_t h = z.size(-1) / 2;
  return torch::cat({z.narrow(-1, h, h), -z.narrow(-1, 0, h)}, -1);
}

struct RotaryFn : public torch::autograd::Function<RotaryFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    return x * cos + rotate_half(x) * sin;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dt = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto& g = grads[0];
    auto gx = (g * saved[0]).to(dt) + rotate_half_adjoint((g * saved[1]).to(dt));
    return {gx, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (!records_grad({&x, &weight})) return rms_norm_plain(x, weight, eps, nullptr);
  return RmsNormFn::apply(x, weight, eps);
}

torch::Tensor swiglu_down(const torch::Tensor& gate, const torch::Tensor& up, LinearImpl& down) {
  const torch::Tensor none;
  const auto& a = down.adapted() ? down.lora_A->weight : none;
  const auto& b = down.adapted() ? down.lora_B->weight : none;
  if (!records_grad({&gate, &up, &down.weight, &down.bias, &a, &b})) return down.forward(torch::silu(gate) * up);
  const auto bias = down.bias.defined() ? down.bias : torch::empty({0}, down.weight.options());
  return SwigluDownFn::apply(gate, up, down.weight, bias, reinterpret_cast<int64_t>(&down));
}

torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  // x [B, heads, T, D]; tables [B, T, D] broadcast over heads.
  const auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  if (!records_grad({&x})) return x * c + rotate_half(x) * s;
  return RotaryFn::apply(x, c, s);
}

namespace {

// inv_freq exactly as HF computes it (fp32 pow), including linear and llama3 scaling.
torch::Tensor make_inv_freq(const ModelConfig& c) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const auto exponents =
      torch::arange(0, c.head_dim, 2, torch::TensorOptions().dtype(torch::kInt64)).to(torch::kFloat32) /
      static_cast<double>(c.head_dim);
  auto inv = 1.0 / torch::pow(torch::scalar_tensor(c.rope.theta, f32), exponents);
  if (c.rope.type == "linear") {
    inv = inv / c.rope.factor;
  } else if (c.rope.type == "llama3") {
    const double old_len = static_cast<double>(c.rope.original_max_position);
    const double low_wavelen = old_len / c.rope.low_freq_factor, high_wavelen = old_len / c.rope.high_freq_factor;
    const auto wavelen = 2 * M_PI / inv;
    auto scaled = torch::where(wavelen > low_wavelen, inv / c.rope.factor, inv);
    const auto smooth =
        (old_len / wavelen - c.rope.low_freq_factor) / (c.rope.high_freq_factor - c.rope.low_freq_factor);
    const auto smoothed = (1 - smooth) * scaled / c.rope.factor + smooth * scaled;
    const auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv = torch::where(medium, smoothed, scaled);
  }
  return inv;
}

}  // namespace

namespace {

// Whether SDPA runs causal attention over grouped K/V heads on a fused kernel (flash or
// cuDNN) for this layout. Otherwise it would take the math kernel, which holds T x T
// weights, and expanding K/V is the better choice. Asked once per layout with small
// tensors: the choice depends on the device, dtype, head counts and head size, not on T.
bool fused_grouped_attention(int64_t heads, int64_t kv_heads, int64_t head_dim, at::ScalarType dtype,
                             torch::Device device) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int64_t, int, int>, bool> known;
  const auto key =
      std::make_tuple(heads, kv_heads, head_dim, static_cast<int>(dtype), static_cast<int>(device.index()));
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(key); it != known.end()) return it->second;
  const auto o = torch::TensorOptions().dtype(dtype).device(device);
  const auto q = torch::empty({1, heads, 8, head_dim}, o), kv = torch::empty({1, kv_heads, 8, head_dim}, o);
  const auto backend = static_cast<at::SDPBackend>(at::_fused_sdp_choice(q, kv, kv, {}, 0.0, true, std::nullopt, true));
  return known[key] = backend == at::SDPBackend::flash_attention || backend == at::SDPBackend::cudnn_attention;
}

}  // namespace

AttentionImpl::AttentionImpl(const ModelConfig& c, torch::TensorOptions opts)
    : heads(c.num_attention_heads), kv_heads(c.num_key_value_heads), head_dim(c.head_dim) {
  q_proj = register_module("q_proj", Linear(c.hidden_size, heads * head_dim, c.qkv_bias, opts));
  k_proj = register_module("k_proj", Linear(c.hidden_size, kv_heads * head_dim, c.qkv_bias, opts));
  v_proj = register_module("v_proj", Linear(c.hidden_size, kv_heads * head_dim, c.qkv_bias, opts));
  o_proj = register_module("o_proj", Linear(heads * head_dim, c.hidden_size, c.o_bias, opts));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim, c.rms_norm_eps, opts));
    k_norm = register_module("k_norm", RMSNorm(head_dim, c.rms_norm_eps, opts));
  }
}

std::array<torch::Tensor, 3> AttentionImpl::project(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  auto q = q_proj(x).view({B, T, heads, head_dim});
  auto k = k_proj(x).view({B, T, kv_heads, head_dim});
  if (q_norm) q = q_norm(q), k = k_norm(k);
  auto v = v_proj(x).view({B, T, kv_heads, head_dim});
  return {q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)};
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RopeTables& rope, const torch::Tensor& mask,
                                     KVCache* cache, int64_t layer) {
  const int64_t B = x.size(0), T = x.size(1);
  auto [q, k, v] = project(x);
  q = rotary(q, rope.cos, rope.sin);
  k = rotary(k, rope.cos, rope.sin);
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
  // An int64 mask holds the sequence lengths of a packed row (hidden_packed).
  const bool packed = mask.defined() && mask.scalar_type() == torch::kInt64;
  std::optional<torch::Tensor> m;
  if (mask.defined() && !packed) m = mask;
  const int64_t groups = heads / kv_heads;
  torch::Tensor o;
  if (T == 1 && groups > 1) {
    // Decode: the G query heads sharing a KV head become G queries of one head (same
    // position, so the key mask broadcasts): no copy of the cache, any SDPA backend.
    auto qg = q.reshape({B, kv_heads, groups, head_dim});
    o = at::scaled_dot_product_attention(qg, k, v, m, 0.0, false).reshape({B, heads, 1, head_dim});
  } else {
    // Prefill/training. Flash attention reads grouped K/V heads as they are (enable_gqa), so
    // on CUDA in half precision without a mask nothing is expanded, and backward keeps
    // K/V at their own size. Elsewhere K/V are expanded to all heads: the memory-efficient
    // kernel (masks, fp32) does not take grouped heads, and the math one would hold T x T.
    const auto dt = q.device().type();
    const auto compute = dt == c10::DeviceType::CUDA && at::autocast::is_autocast_enabled(dt)
                             ? at::autocast::get_autocast_dtype(dt)
                             : q.scalar_type();
    const bool native_gqa = groups > 1 && !m && dt == c10::DeviceType::CUDA &&
                            (compute == at::kBFloat16 || compute == at::kHalf) &&
                            fused_grouped_attention(heads, kv_heads, head_dim, compute, q.device());
    if (groups > 1 && !native_gqa) {
      k = k.repeat_interleave(groups, 1);
      v = v.repeat_interleave(groups, 1);
    }
    if (packed) {
      // Causal attention per packed sequence: exactly each sequence's own attention, at
      // sum(len^2) cost instead of T^2, and no mask tensor.
      const auto* len = mask.data_ptr<int64_t>();
      std::vector<torch::Tensor> parts;
      int64_t off = 0;
      for (int64_t i = 0; i < mask.numel(); off += len[i++])
        parts.push_back(at::scaled_dot_product_attention(q.narrow(2, off, len[i]), k.narrow(2, off, len[i]),
                                                         v.narrow(2, off, len[i]), {}, 0.0, /*is_causal=*/true,
                                                         std::nullopt, native_gqa));
      o = parts.size() == 1 ? parts[0] : torch::cat(parts, 2);
    } else {
      o = at::scaled_dot_product_attention(q, k, v, m, 0.0, /*is_causal=*/!mask.defined(), std::nullopt, native_gqa);
    }
  }
  return o_proj(o.transpose(1, 2).reshape({B, T, heads * head_dim}));
}

MLPImpl::MLPImpl(const ModelConfig& c, torch::TensorOptions opts) {
  gate_proj = register_module("gate_proj", Linear(c.hidden_size, c.intermediate_size, c.mlp_bias, opts));
  up_proj = register_module("up_proj", Linear(c.hidden_size, c.intermediate_size, c.mlp_bias, opts));
  down_proj = register_module("down_proj", Linear(c.intermediate_size, c.hidden_size, c.mlp_bias, opts));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) { return swiglu_down(gate_proj(x), up_proj(x), *down_proj); }

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
  model = register_module("model", std::make_shared<BackboneImpl>(c, opts));
  if (!c.tie_word_embeddings)
    lm_head = register_module("lm_head", std::make_shared<LinearImpl>(c.hidden_size, c.vocab_size, false, opts));
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
// With sharded parameters (hooks_ptr: a ParamHooks*, 0 for none) backward first asks for
// layer `index`'s full weights (pre_backward), since the recompute reads them.
struct LayerCheckpoint : public torch::autograd::Function<LayerCheckpoint> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor cos,
                               torch::Tensor sin, torch::Tensor mask, int64_t layer_ptr, int64_t hooks_ptr,
                               int64_t index) {
    // An empty mask stands for "no mask": autograd records every tensor argument of
    // apply(), and an undefined one has no device to record.
    if (mask.numel() == 0) mask = torch::Tensor();
    ctx->saved_data["layer"] = layer_ptr;
    ctx->saved_data["hooks"] = hooks_ptr;
    ctx->saved_data["index"] = index;
    ctx->saved_data["mask"] = mask;
    // The recompute must run under the forward's autocast state, or it would recompute in
    // another precision (slower, and not the activations the forward used).
    AutocastState::of(x.device().type()).save(ctx);
    ctx->save_for_backward({x, cos, sin});
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(layer_ptr);
    return layer->forward(x, RopeTables{cos, sin}, mask, nullptr, 0);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    const torch::Tensor mask =
        ctx->saved_data["mask"].isTensor() ? ctx->saved_data["mask"].toTensor() : torch::Tensor();
    if (auto* hooks = reinterpret_cast<ParamHooks*>(ctx->saved_data["hooks"].toInt()))
      hooks->pre_backward(ctx->saved_data["index"].toInt());
    auto x = saved[0].detach().requires_grad_(true);
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true);
      AutocastScope scope(AutocastState::load(ctx));
      out = layer->forward(x, RopeTables{saved[1], saved[2]}, mask, nullptr, 0);
    }
    torch::autograd::backward({out}, {grads[0]});
    return {x.grad(),        torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor CausalLMImpl::run_layer(int64_t l, const torch::Tensor& x, const RopeTables& r, const torch::Tensor& mask,
                                      KVCache* cache, bool ckpt) {
  auto* layer = model->layers[l]->as<DecoderLayerImpl>();
  if (hooks_) hooks_->pre_forward(l);
  torch::Tensor y;
  if (ckpt)
    y = LayerCheckpoint::apply(x, r.cos, r.sin,
                               mask.defined() ? mask : torch::empty({0}, x.options().dtype(torch::kBool)),
                               reinterpret_cast<int64_t>(layer), reinterpret_cast<int64_t>(hooks_), l);
  else
    y = layer->forward(x, r, mask, cache, l);
  if (hooks_) {
    hooks_->post_forward(l);
    // Without recomputation autograd keeps references to the layer's weights; the hook on
    // the output's gradient runs just before the layer's backward and lets the owner refill them.
    if (!ckpt && y.requires_grad()) {
      auto* h = hooks_;
      y.register_hook([h, l](const torch::Tensor&) { h->pre_backward(l); });
    }
  }
  return y;
}

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
      throw Error("KV cache: " + std::to_string(keys) + " tokens exceed its capacity " +
                  std::to_string(cache->capacity));
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
  if (hooks_) hooks_->pre_forward(-1);
  auto x = model->embed_tokens(ids_d);
  const bool ckpt = checkpointing_ && recompute_layers_ != 0 && !cache && torch::GradMode::is_enabled();
  // A frozen embedding (LoRA) gives an input that needs no gradient; a checkpointed layer
  // whose inputs need none would cut its adapters off from the loss. As HF's
  // enable_input_require_grads does, the input then becomes a leaf that asks for one.
  if (ckpt && !x.requires_grad()) x = x.detach().requires_grad_(true);
  for (int64_t l = 0; l < static_cast<int64_t>(model->layers->size()); ++l)
    x = run_layer(l, x, r, mask, cache, ckpt && recomputes(l));
  if (cache) cache->length += T;
  return model->norm(x);
}

torch::Tensor CausalLMImpl::hidden_packed(const torch::Tensor& ids, const std::vector<int64_t>& segments) {
  TORCH_CHECK(ids.dim() == 2 && ids.size(0) == 1, "hidden_packed: ids must be one row [1, T]");
  const int64_t T = ids.size(1);
  int64_t total = 0;
  std::vector<int64_t> pos;
  pos.reserve(T);
  for (int64_t n : segments) {
    TORCH_CHECK(n >= 1, "hidden_packed: a packed sequence has length ", n);
    for (int64_t t = 0; t < n; ++t) pos.push_back(t);
    total += n;
  }
  TORCH_CHECK(total == T, "hidden_packed: the sequence lengths sum to ", total, ", the row has ", T, " tokens");
  const auto dev = opts_.device();
  const auto lens = torch::tensor(segments, torch::kInt64);  // stays on the CPU: read by the host
  const RopeTables r = rope(torch::tensor(pos, torch::kInt64).to(dev).unsqueeze(0));
  if (hooks_) hooks_->pre_forward(-1);
  auto x = model->embed_tokens(ids.to(dev, torch::kInt64));
  const bool ckpt = checkpointing_ && recompute_layers_ != 0 && torch::GradMode::is_enabled();
  if (ckpt && !x.requires_grad()) x = x.detach().requires_grad_(true);  // as in hidden()
  for (int64_t l = 0; l < static_cast<int64_t>(model->layers->size()); ++l)
    x = run_layer(l, x, r, lens, nullptr, ckpt && recomputes(l));
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
  if (hooks_) hooks_->pre_forward(-1);
  auto x = model->embed_tokens(tok);
  for (int64_t l = 0; l < static_cast<int64_t>(model->layers->size()); ++l) x = run_layer(l, x, r, mask, &cache, false);
  return logits(model->norm(x)).squeeze(1);
}

torch::Tensor CausalLMImpl::logits(const torch::Tensor& h) {
  return lm_head ? lm_head->forward(h) : torch::nn::functional::linear(h, model->embed_tokens->weight);
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

namespace {

// The dtype the head's matmul runs in: autocast's when autocast is on for this device
// (as the unchunked logits(h) would), else the weight's.
torch::ScalarType head_compute_dtype(const torch::Tensor& h, const torch::Tensor& w) {
  const auto dt = h.device().type();
  if ((dt == c10::DeviceType::CUDA || dt == c10::DeviceType::CPU) && at::autocast::is_autocast_enabled(dt))
    return at::autocast::get_autocast_dtype(dt);
  return w.scalar_type();
}

// Chunked log-softmax at the targets. Forward saves h, the weight, the targets and one fp32
// log-sum-exp per row; backward recomputes each chunk's logits:
//   d logp_i / d z_ij = [j == target_i] - softmax(z_i)_j   (z = h W^T / temperature).
struct ChunkedLogprobs : public torch::autograd::Function<ChunkedLogprobs> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, torch::Tensor h, torch::Tensor w,
                                                torch::Tensor targets, double temperature, int64_t chunk) {
    const auto cd = head_compute_dtype(h, w);
    const int64_t n = h.size(0);
    const auto f32 = h.options().dtype(torch::kFloat32);
    auto logp = torch::empty({n}, f32), ent = torch::empty({n}, f32), lse = torch::empty({n}, f32);
    const auto wc = w.to(cd);
    for (int64_t s = 0; s < n; s += chunk) {
      const int64_t c = std::min(chunk, n - s);
      auto z = torch::matmul(h.narrow(0, s, c).to(cd), wc.t()).to(torch::kFloat32);
      if (temperature != 1.0) z = z / temperature;
      const auto l = torch::logsumexp(z, -1);
      const auto tgt = targets.narrow(0, s, c).unsqueeze(1);
      logp.narrow(0, s, c).copy_(z.gather(1, tgt).squeeze(1) - l);
      // Entropy = lse - sum_j p_j z_j, from the same chunk (no second pass).
      const auto p = torch::exp(z - l.unsqueeze(1));
      ent.narrow(0, s, c).copy_(l - (p * z).sum(-1));
      lse.narrow(0, s, c).copy_(l);
    }
    ctx->save_for_backward({h, w, targets, lse});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["cd"] = static_cast<int64_t>(cd);
    ctx->mark_non_differentiable({ent});
    return {logp, ent};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &w = saved[1], &targets = saved[2], &lse = saved[3];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto cd = static_cast<torch::ScalarType>(ctx->saved_data["cd"].toInt());
    const bool need_h = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    torch::Tensor gh, gw;
    if (!grads[0].defined() || (!need_h && !need_w)) return {gh, gw, {}, {}, {}};
    const auto g = grads[0].to(torch::kFloat32);
    const int64_t n = h.size(0);
    const auto wc = w.to(cd);
    if (need_h) gh = torch::empty_like(h);
    if (need_w) gw = torch::zeros(w.sizes(), w.options().dtype(torch::kFloat32));
    for (int64_t s = 0; s < n; s += chunk) {
      const int64_t c = std::min(chunk, n - s);
      const auto hc = h.narrow(0, s, c).to(cd);
      auto z = torch::matmul(hc, wc.t()).to(torch::kFloat32);
      if (temperature != 1.0) z = z / temperature;
      const auto gc = g.narrow(0, s, c).unsqueeze(1);
      auto dz = torch::exp(z - lse.narrow(0, s, c).unsqueeze(1)).mul_(-gc);
      dz.scatter_add_(1, targets.narrow(0, s, c).unsqueeze(1), gc);
      if (temperature != 1.0) dz.div_(temperature);
      const auto dzc = dz.to(cd);
      if (need_h) gh.narrow(0, s, c).copy_(torch::matmul(dzc, wc));
      if (need_w) gw.add_(torch::matmul(dzc.t(), hc).to(torch::kFloat32));
    }
    if (need_w && gw.scalar_type() != w.scalar_type()) gw = gw.to(w.scalar_type());
    return {gh, gw, {}, {}, {}};
  }
};

}  // namespace

TokenLogprobs chunked_logprobs(const torch::Tensor& h, const torch::Tensor& weight, const torch::Tensor& targets,
                               double temperature, int64_t chunk) {
  TORCH_CHECK(h.dim() == 2 && weight.dim() == 2 && h.size(1) == weight.size(1),
              "chunked_logprobs: h [N, H], weight [V, H]");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == h.size(0), "chunked_logprobs: targets [N]");
  TORCH_CHECK(temperature > 0, "temperature must be positive");
  TORCH_CHECK(chunk >= 1, "chunked_logprobs: chunk must be >= 1");
  if (h.size(0) == 0) {
    const auto e = torch::zeros({0}, h.options().dtype(torch::kFloat32));
    return {e + h.sum().to(torch::kFloat32) * 0, e};  // keeps the graph connected
  }
  auto out = ChunkedLogprobs::apply(h, weight, targets.to(h.device(), torch::kInt64), temperature, chunk);
  return {out[0], out[1]};
}

const torch::Tensor& CausalLMImpl::head_weight() { return lm_head ? lm_head->weight : model->embed_tokens->weight; }

TokenLogprobs CausalLMImpl::selected_logprobs(const torch::Tensor& ids, const torch::Tensor& attention_mask,
                                              const torch::Tensor& wanted, double temperature, int64_t chunk,
                                              const std::vector<int64_t>& segments) {
  TORCH_CHECK(ids.size(1) >= 2, "selected_logprobs needs at least two tokens per row");
  const int64_t B = ids.size(0), T = ids.size(1);
  TORCH_CHECK(wanted.dim() == 2 && wanted.size(0) == B && wanted.size(1) == T - 1,
              "selected_logprobs: wanted [B, T-1]");
  TORCH_CHECK(segments.empty() || !attention_mask.defined(), "selected_logprobs: packed rows take no attention mask");
  const auto h = segments.empty() ? hidden(ids, attention_mask, nullptr) : hidden_packed(ids, segments);
  const auto dev = h.device();
  const auto idx = (wanted.to(dev).reshape({-1}) != 0).nonzero().squeeze(1);  // flat (b, t) of wanted rows
  const auto hs = h.narrow(1, 0, T - 1).reshape({B * (T - 1), h.size(2)}).index_select(0, idx);
  const auto tgt = ids.to(dev, torch::kInt64).narrow(1, 1, T - 1).reshape({-1}).index_select(0, idx);
  const auto r = chunked_logprobs(hs, head_weight(), tgt, temperature, chunk);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
  TokenLogprobs out;
  out.logp = torch::zeros({B * (T - 1)}, f32).index_copy(0, idx, r.logp).view({B, T - 1});
  out.entropy = torch::zeros({B * (T - 1)}, f32).index_copy(0, idx, r.entropy).view({B, T - 1});
  return out;
}

void CausalLMImpl::enable_lora(const LoraConfig& cfg, uint64_t seed, torch::ScalarType adapter_dtype) {
  if (lora_.rank > 0) throw Error("LoRA: adapters are already enabled on this model");
  if (cfg.rank < 1) throw Error("LoRA: rank must be >= 1 (got " + std::to_string(cfg.rank) + ")");
  if (cfg.targets.empty()) throw Error("LoRA: no target projections given");
  static const std::vector<std::string> known = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  for (const auto& t : cfg.targets)
    if (std::find(known.begin(), known.end(), t) == known.end())
      throw Error("LoRA: unknown target projection '" + t +
                  "' (known: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  for (auto& p : parameters()) p.set_requires_grad(false);
  auto gen = at::globalContext().defaultGenerator(torch::kCPU).clone();
  gen.set_current_seed(seed);
  // Adapters are drawn in layer/target order from one seeded CPU generator.
  const auto aopts = opts_.dtype(adapter_dtype);
  for (std::size_t l = 0; l < model->layers->size(); ++l) {
    auto* layer = model->layers[l]->as<DecoderLayerImpl>();
    for (const auto& t : cfg.targets) {
      LinearImpl* lin = t == "q_proj"      ? layer->self_attn->q_proj.get()
                        : t == "k_proj"    ? layer->self_attn->k_proj.get()
                        : t == "v_proj"    ? layer->self_attn->v_proj.get()
                        : t == "o_proj"    ? layer->self_attn->o_proj.get()
                        : t == "gate_proj" ? layer->mlp->gate_proj.get()
                        : t == "up_proj"   ? layer->mlp->up_proj.get()
                                           : layer->mlp->down_proj.get();
      lin->add_lora(cfg.rank, cfg.scale(), aopts, gen);
    }
  }
  lora_ = cfg;
}

void CausalLMImpl::set_adapters_active(bool on) {
  for (auto& m : modules(/*include_self=*/false))
    if (auto* lin = m->as<LinearImpl>()) lin->lora_active = on;
}

std::map<std::string, torch::Tensor> CausalLMImpl::merged_weights() {
  torch::NoGradGuard ng;
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : named_parameters())
    if (!is_lora_param(p.key())) out[p.key()] = p.value().detach();
  for (const auto& m : named_modules("", /*include_self=*/false)) {
    auto* lin = m.value()->as<LinearImpl>();
    if (!lin || !lin->lora_A) continue;
    const auto delta = torch::matmul(lin->lora_B->weight.to(torch::kFloat32), lin->lora_A->weight.to(torch::kFloat32));
    auto& w = out[m.key() + ".weight"];
    w = (w.to(torch::kFloat32) + lin->lora_scale * delta.to(w.device())).to(w.scalar_type());
  }
  return out;
}

void CausalLMImpl::init_random(uint64_t seed, double std) {
  torch::NoGradGuard no_grad;
  auto gen = at::globalContext().defaultGenerator(opts_.device()).clone();
  gen.set_current_seed(seed);
  for (auto& p : named_parameters()) {
    const std::string& n = p.key();
    auto& t = p.value();
    if (n.find("norm") != std::string::npos)
      t.fill_(1.0);
    else if (n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0)
      t.zero_();
    else
      t.normal_(0.0, std, gen);
  }
}

}  // namespace kf::policy
