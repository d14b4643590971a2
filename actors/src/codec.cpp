// TextCodec: text <-> token ids over a BPE tokenizer or raw bytes.
#include "kf/actors/actors.h"

namespace kf::actors {

TextCodec TextCodec::bytes() { return TextCodec(); }

TextCodec TextCodec::bpe(policy::Tokenizer tok) {
  TextCodec c;
  c.tok_ = std::move(tok);
  return c;
}

std::vector<int32_t> TextCodec::encode(const std::string& text) const {
  if (tok_) return tok_->encode(text);
  std::vector<int32_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string TextCodec::decode(const std::vector<int32_t>& ids) const {
  if (tok_) return tok_->decode(ids);
  std::string s;
  s.reserve(ids.size());
  for (int32_t id : ids) s.push_back(static_cast<char>(id & 0xFF));
  return s;
}

}  // namespace kf::actors
