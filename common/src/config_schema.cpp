// The one table of configuration keys. Add a component's keys here, grouped by section.
#include "kf/common/config.h"

namespace kf {

const std::vector<ConfigKey>& config_schema() {
  using T = ConfigType;
  static const std::vector<ConfigKey> schema = {
      // run: identity and placement of a run
      {"run.name", T::String, "default", false, {}, "run directory name under run.root"},
      {"run.root", T::String, "runs", false, {}, "folder that holds run directories"},
      {"run.seed", T::Int, "0", false, {}, "master seed for inputs, sampling and init"},
      {"run.backend", T::String, "auto", false, {"auto", "cpu", "cuda"}, "where references and kernels run"},
      {"run.log_level", T::String, "info", false, {"debug", "info", "warn", "error"}, "minimum log level"},
      // tasks: which task artifacts a run uses
      {"tasks.dir", T::String, "build/tasks", false, {}, "folder of imported task artifacts (tools/import-tasks)"},
      {"tasks.levels", T::IntList, "[1, 2, 3]", false, {}, "task levels to use"},
      {"tasks.include", T::StringList, "[]", false, {}, "task names to use (empty: all of the chosen levels)"},
      // reference: how the reference programs are timed in the foundation job
      {"reference.warmup", T::Int, "2", false, {}, "untimed reference calls before timing"},
      {"reference.trials", T::Int, "5", false, {}, "timed reference calls per task (median reported)"},
  };
  return schema;
}

}  // namespace kf
