// ChatTemplate (kf/policy/policy.h): layouts from jinja2, filled in C++; how and why:
// policy/src/chat_template.h. load() renders the [user] layout at once, so a template that
// cannot be rendered exactly fails there (kf::Error naming the file and the Python or jinja2
// failure); render() fails naming the template for a conversation it rejects
// (raise_exception) or an empty content a laid-out sequence branches on.
#include "kf/policy/policy.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kf/common/error.h"
#include "chat_template.h"

extern char** environ;

#ifndef KF_PYTHON_BUILT
#define KF_PYTHON_BUILT "python3"
#endif
#ifndef KF_SOURCE_DIR_BUILT
#define KF_SOURCE_DIR_BUILT "."
#endif

namespace kf::policy {
namespace {

using json = nlohmann::json;

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One layout: pieces[0] slot[0] pieces[1] ... slot[n-1] pieces[n]. Or `exact`: the template
// transforms or branches on the text for this role sequence, so every conversation of it is
// rendered by jinja2 itself (the renderer's serve process).
struct Layout {
  bool exact = false;
  std::vector<std::string> pieces;
  std::vector<std::size_t> slots;
  std::vector<bool> lstrip, rstrip;
  std::vector<bool> empty_ok;  // per message
};

std::string python_path() {
  const char* e = std::getenv("KF_PYTHON");
  return e && *e ? e : KF_PYTHON_BUILT;
}

std::string script_path() {
  const std::string rel = "/policy/tools/kf_chat_template.py";
  if (const char* s = std::getenv("KF_SOURCE_DIR"); s && *s && file_exists(s + rel)) return s + rel;
  return std::string(KF_SOURCE_DIR_BUILT) + rel;
}

std::string roles_text(const std::vector<std::string>& roles) {
  std::string s = "[";
  for (std::size_t i = 0; i < roles.size(); ++i) s += (i ? ", " : "") + roles[i];
  return s + "]";
}

// Runs the layout script; stdout is the JSON layout, stderr the reason of a failure.
Layout fetch_layout(const std::string& model_dir, const std::string& source, const std::vector<std::string>& roles,
                    const std::string& vars) {
  const std::string py = python_path(), script = script_path();
  const std::string what = source + ": laying out the chat template for roles " + roles_text(roles);
  if (!file_exists(script))
    throw Error(what + ": the renderer " + script + " is not found (set KF_SOURCE_DIR to the source tree)");
  char out_tpl[] = "/tmp/kf-chat-out-XXXXXX";
  char err_tpl[] = "/tmp/kf-chat-err-XXXXXX";
  const int out_fd = ::mkstemp(out_tpl);
  const int err_fd = ::mkstemp(err_tpl);
  if (out_fd < 0 || err_fd < 0) {
    if (out_fd >= 0) ::close(out_fd), ::unlink(out_tpl);
    if (err_fd >= 0) ::close(err_fd), ::unlink(err_tpl);
    throw Error(what + ": cannot create a temporary file in /tmp: " + std::strerror(errno));
  }
  std::vector<std::string> args = {py, script, "layout", "--vars", vars, model_dir};
  args.insert(args.end(), roles.begin(), roles.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  pid_t pid = -1;
  const int err = posix_spawnp(&pid, py.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out_fd);
  ::close(err_fd);
  int status = 0;
  if (err == 0)
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  const std::string out = slurp(out_tpl), errs = slurp(err_tpl);
  ::unlink(out_tpl);
  ::unlink(err_tpl);
  if (err != 0) throw Error(what + ": cannot start python '" + py + "': " + std::strerror(err) + " (set KF_PYTHON)");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string reason = errs;
    while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
    if (reason.size() > 2000) reason = "..." + reason.substr(reason.size() - 2000);
    const std::string how = WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                              : "signal " + std::to_string(WTERMSIG(status));
    throw Error(what + " failed (" + py + " " + script + ", " + how + "): " + reason);
  }
  Layout l;
  try {
    const json j = json::parse(out);
    if (j.value("exact", false)) {
      l.exact = true;
      l.empty_ok.assign(roles.size(), true);
      return l;
    }
    for (const auto& p : j.at("pieces")) l.pieces.push_back(p.get<std::string>());
    for (const auto& s : j.at("slots")) l.slots.push_back(s.get<std::size_t>());
    for (const auto& b : j.at("lstrip")) l.lstrip.push_back(b.get<bool>());
    for (const auto& b : j.at("rstrip")) l.rstrip.push_back(b.get<bool>());
    for (const auto& b : j.at("empty_ok")) l.empty_ok.push_back(b.get<bool>());
  } catch (const std::exception& e) {
    throw Error(what + ": the renderer's output is not a layout (" + e.what() + ")");
  }
  if (l.pieces.size() != l.slots.size() + 1 || l.lstrip.size() != l.slots.size() || l.rstrip.size() != l.slots.size() ||
      l.empty_ok.size() != roles.size())
    throw Error(what + ": the renderer's layout is inconsistent");
  for (auto s : l.slots)
    if (s >= roles.size()) throw Error(what + ": the renderer's layout names message " + std::to_string(s));
  return l;
}

// Decodes the code point at s[i] (valid UTF-8 assumed; a bad byte counts as one non-space).
uint32_t cp_at(const std::string& s, std::size_t i, std::size_t* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  auto cont = [&](std::size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) & 0x3Fu : 0u; };
  if (b < 0x80) return *len = 1, b;
  if ((b >> 5) == 6 && i + 1 < s.size()) return *len = 2, ((b & 0x1Fu) << 6) | cont(1);
  if ((b >> 4) == 14 && i + 2 < s.size()) return *len = 3, ((b & 0x0Fu) << 12) | (cont(1) << 6) | cont(2);
  if ((b >> 3) == 30 && i + 3 < s.size())
    return *len = 4, ((b & 0x07u) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
  return *len = 1, 0xFFFD;
}

bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace

std::string py_lstrip(const std::string& s) {
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t len = 1;
    if (!py_space(cp_at(s, i, &len))) break;
    i += len;
  }
  return s.substr(i);
}

std::string py_rstrip(const std::string& s) {
  std::size_t end = s.size();
  while (end > 0) {
    std::size_t start = end - 1;  // back to the lead byte of the last code point
    while (start > 0 && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    std::size_t len = 1;
    const uint32_t c = cp_at(s, start, &len);
    if (start + len != end || !py_space(c)) break;
    end = start;
  }
  return s.substr(0, end);
}

struct ChatTemplate::Impl {
  std::string dir, source, vars = "{}";
  mutable std::mutex mu;
  mutable std::map<std::vector<std::string>, Layout> layouts;
  // The serve process (kf_chat_template.py serve) for role sequences rendered exactly:
  // started at the first such conversation, one request line and one reply line each.
  mutable std::mutex serve_mu;
  mutable pid_t serve_pid = -1;
  mutable int serve_in = -1, serve_out = -1;
  mutable std::string serve_buf;

  ~Impl() { stop_server(); }

  const Layout& layout(const std::vector<std::string>& roles) const {
    std::lock_guard<std::mutex> lk(mu);
    auto it = layouts.find(roles);
    if (it == layouts.end()) it = layouts.emplace(roles, fetch_layout(dir, source, roles, vars)).first;
    return it->second;
  }

  void stop_server() const {
    if (serve_in >= 0) ::close(serve_in);
    if (serve_out >= 0) ::close(serve_out);
    serve_in = serve_out = -1;
    if (serve_pid > 0) {
      ::kill(serve_pid, SIGKILL);
      while (::waitpid(serve_pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    serve_pid = -1;
    serve_buf.clear();
  }

  void start_server() const {
    const std::string py = python_path(), script = script_path();
    int to_child[2], from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0) throw Error(source + ": pipe: " + std::strerror(errno));
    if (::pipe2(from_child, O_CLOEXEC) != 0) {
      ::close(to_child[0]), ::close(to_child[1]);
      throw Error(source + ": pipe: " + std::strerror(errno));
    }
    std::vector<std::string> args = {py, script, "serve", "--vars", vars, dir};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
    pid_t pid = -1;
    const int err = posix_spawnp(&pid, py.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(to_child[0]);
    ::close(from_child[1]);
    if (err != 0) {
      ::close(to_child[1]), ::close(from_child[0]);
      throw Error(source + ": cannot start python '" + py + "' for exact rendering: " + std::strerror(err) +
                  " (set KF_PYTHON)");
    }
    serve_pid = pid;
    serve_in = to_child[1];
    serve_out = from_child[0];
  }

  // One conversation through jinja2 (the template transforms or branches on its text).
  std::string render_exact(const std::vector<ChatMessage>& messages) const {
    json req = {{"messages", json::array()}};
    for (const auto& m : messages) req["messages"].push_back({{"role", m.role}, {"content", m.content}});
    const std::string line = req.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    std::lock_guard<std::mutex> lk(serve_mu);
    if (serve_pid < 0) start_server();
    // A renderer that died must not take this process with it: SIGPIPE is blocked on this
    // thread for the write, and one it raised is taken back before the mask is restored.
    sigset_t pipe_sig, old_mask;
    sigemptyset(&pipe_sig);
    sigaddset(&pipe_sig, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_sig, &old_mask);
    const char* p = line.data();
    std::size_t left = line.size();
    bool broken = false;
    while (left > 0) {
      const ssize_t n = ::write(serve_in, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        broken = true;
        break;
      }
      p += n, left -= static_cast<std::size_t>(n);
    }
    if (broken) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_sig, nullptr, &zero) > 0) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    if (broken) {
      stop_server();
      throw Error(source + ": the exact renderer (" + script_path() + " serve) is gone: write failed");
    }
    std::size_t nl;
    while ((nl = serve_buf.find('\n')) == std::string::npos) {
      char buf[65536];
      const ssize_t n = ::read(serve_out, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        stop_server();
        throw Error(source + ": the exact renderer (" + script_path() + " serve) exited without a reply");
      }
      serve_buf.append(buf, static_cast<std::size_t>(n));
    }
    const std::string reply = serve_buf.substr(0, nl);
    serve_buf.erase(0, nl + 1);
    json j;
    try {
      j = json::parse(reply);
    } catch (const std::exception& e) {
      stop_server();
      throw Error(source + ": the exact renderer's reply is not JSON (" + e.what() + ")");
    }
    if (j.contains("error")) throw Error(j["error"].get<std::string>());
    return j.at("text").get<std::string>();
  }
};

namespace {
// Where the template is, as transformers looks: chat_template.jinja first. "" if none.
std::string template_source(const std::string& dir) {
  if (file_exists(dir + "/chat_template.jinja")) return dir + "/chat_template.jinja";
  const std::string cfg = dir + "/tokenizer_config.json";
  if (!file_exists(cfg)) return "";
  json j;
  try {
    j = json::parse(slurp(cfg));
  } catch (const std::exception& e) {
    throw Error(cfg + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("chat_template") || j["chat_template"].is_null()) return "";
  const auto& t = j["chat_template"];
  if (!t.is_string() && !t.is_array())
    throw Error(cfg + ": field 'chat_template': must be a string or a list of {name, template}");
  return cfg + ": field 'chat_template'";
}
}  // namespace

bool ChatTemplate::present(const std::string& model_dir) {
  return !model_dir.empty() && !template_source(model_dir).empty();
}

std::optional<ChatTemplate> ChatTemplate::load(const std::string& model_dir, const std::string& vars_json) {
  const std::string source = template_source(model_dir);
  if (source.empty()) return std::nullopt;
  ChatTemplate t;
  t.impl_ = std::make_shared<Impl>();
  t.impl_->dir = model_dir;
  t.impl_->source = source;
  if (!vars_json.empty()) {
    json v;
    try {
      v = json::parse(vars_json);
    } catch (const std::exception& e) {
      throw Error(source + ": template variables are not JSON (" + e.what() + "): " + vars_json);
    }
    if (!v.is_object()) throw Error(source + ": template variables must be a JSON object: " + vars_json);
    t.impl_->vars = v.dump();
  }
  t.impl_->layout({"user"});  // fail at load, not at the first prompt
  return t;
}

std::shared_ptr<const ChatTemplate> ChatTemplate::for_model(const std::string& model_dir,
                                                            const std::string& vars_json) {
  if (model_dir.empty()) return nullptr;
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, std::shared_ptr<const ChatTemplate>> cache;
  std::lock_guard<std::mutex> lk(mu);
  auto it = cache.find({model_dir, vars_json});
  if (it != cache.end()) return it->second;
  auto t = load(model_dir, vars_json);
  auto p = t ? std::make_shared<const ChatTemplate>(std::move(*t)) : nullptr;
  cache.emplace(std::make_pair(model_dir, vars_json), p);
  return p;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  if (messages.empty()) throw Error(impl_->source + ": rendering an empty conversation");
  std::vector<std::string> roles;
  for (const auto& m : messages) roles.push_back(m.role);
  const Layout& l = impl_->layout(roles);
  if (l.exact) return impl_->render_exact(messages);
  for (std::size_t i = 0; i < messages.size(); ++i)
    if (messages[i].content.empty() && !l.empty_ok[i])
      throw Error(impl_->source + ": message " + std::to_string(i) + " (" + messages[i].role +
                  ") is empty, and this template renders an empty content differently from a placed one; "
                  "give it text");
  std::size_t n = l.pieces[0].size();
  for (std::size_t k = 0; k < l.slots.size(); ++k) n += messages[l.slots[k]].content.size() + l.pieces[k + 1].size();
  std::string out;
  out.reserve(n);
  out += l.pieces[0];
  for (std::size_t k = 0; k < l.slots.size(); ++k) {
    const std::string& c = messages[l.slots[k]].content;
    if (l.lstrip[k] && l.rstrip[k])
      out += py_rstrip(py_lstrip(c));
    else if (l.lstrip[k])
      out += py_lstrip(c);
    else if (l.rstrip[k])
      out += py_rstrip(c);
    else
      out += c;
    out += l.pieces[k + 1];
  }
  return out;
}

const std::string& ChatTemplate::model_dir() const { return impl_->dir; }
const std::string& ChatTemplate::source() const { return impl_->source; }

}  // namespace kf::policy
