// Task-name lists kept in files, such as the held-out split (tasks/heldout.txt): one task
// name per line; '#' starts a comment; blank lines are ignored. Names are folder names
// of imported tasks (letters, digits, '_', '-', '.'), so a typo such as a path or two
// names on one line is an error rather than a name that silently matches nothing.
// Pure functions; any thread.
#pragma once
#include <string>
#include <vector>

namespace kf::tasks {

// The names in `path`, in file order, without duplicates. Throws kf::Error naming the
// file (and the line) when it cannot be read or a line is not a task name.
std::vector<std::string> read_task_list(const std::string& path);

// Parses the text of such a file; `source` names it in errors.
std::vector<std::string> parse_task_list(const std::string& text, const std::string& source);

}  // namespace kf::tasks
