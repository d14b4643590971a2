#!/usr/bin/env bash
# KernelForge setup: installs what the project needs, builds it, imports the task suite.
# Idempotent: a second run only checks, and rebuilds what changed.
#   ./setup.sh            everything (Debian packages, Python venv, build, task import)
#   KF_JOBS=N ./setup.sh  build parallelism (default: number of cores)
#   KF_CMAKE_ARGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo" ./setup.sh   extra CMake arguments for a new build
#                         folder (the default build is Release: no debug info)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$PWD
say() { echo "[setup] $*"; }

# --- 1. Debian packages, pinned (Debian 12 "bookworm").
APT_PACKAGES=(
  cmake=3.25.1-1
  ninja-build=1.11.1-2~deb12u1
  g++=4:12.2.0-3
  python3-venv=3.11.2-1+b1
  libgtest-dev=1.12.1-0.2
  libtbb-dev=2021.8.0-2+deb12u1
  libyaml-cpp-dev=0.7.0+dfsg-8+b1
  nlohmann-json3-dev=3.11.2-2
  libcli11-dev=2.1.2+ds-1
  libseccomp-dev=2.5.4-1+deb12u1
  libboost-dev=1.74.0.3
  libhiredis-dev=0.14.1-3               # netqueue: the cross-node queue's Redis client
  redis-server=5:7.0.15-1~deb12u10      # netqueue: XAUTOCLAIM needs redis >= 7.0; tests start their own
)
missing=()
for spec in "${APT_PACKAGES[@]}"; do
  name=${spec%%=*}; want=${spec#*=}
  have=$(dpkg-query -W -f='${Version}' "$name" 2>/dev/null || true)
  [ "$have" = "$want" ] || missing+=("$spec")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  say "Debian packages: all present"
fi

# --- 2. Python venv with pinned packages (torch brings libtorch for the C++ build).
PY=${KF_PYTHON:-$ROOT/.venv/bin/python3}
if [ -z "${KF_PYTHON:-}" ]; then
  [ -x "$PY" ] || { say "creating .venv"; python3 -m venv "$ROOT/.venv"; }
  stamp="$ROOT/.venv/.kf-requirements"
  if ! cmp -s requirements.txt "$stamp"; then
    say "installing Python packages (requirements.txt)"
    "$PY" -m pip install -q --upgrade pip==24.3.1
    "$PY" -m pip install -q -r requirements.txt
    cp requirements.txt "$stamp"
  else
    say "Python packages: up to date"
  fi
fi

# --- 3. Configure and build.
BUILD=${KF_BUILD_DIR:-$ROOT/build}
if [ ! -f "$BUILD/build.ninja" ]; then
  say "configuring $BUILD"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DKF_PYTHON="$PY" ${KF_CMAKE_ARGS:-}
fi
say "building"
cmake --build "$BUILD" -j "${KF_JOBS:-$(nproc)}"

# --- 4. Import the built-in task suite (only files changed since the last import).
say "importing tasks/suite -> $BUILD/tasks (${KF_TASK_BACKENDS:-cpu})"
"$PY" "$ROOT/tasks/importer/kf_import.py" "$ROOT/tasks/suite" --out "$BUILD/tasks" \
  --backends "${KF_TASK_BACKENDS:-cpu}" --skip-fresh
say "done"
