#!/usr/bin/env bash
# Install the system packages profkit needs, idempotently, on Debian 12 or
# Ubuntu 24.04.  Used by `make`, by .ci/run and by the Vagrantfile.
# Skips apt entirely when everything is already present (fast re-runs).
set -euo pipefail

. /etc/os-release
ID_LIKE=${ID_LIKE:-}

pkgs=(
  build-essential bison flex libreadline-dev zlib1g-dev libicu-dev pkg-config
  ccache binutils valgrind ltrace bpftrace bpfcc-tools python3-bpfcc
  libelf-dev dpkg-dev xz-utils bzip2 curl ca-certificates git
  python3-venv python3-dev chromium ruby gdb perl postgresql
  shellcheck lld clang time nodejs e2fsprogs
)
case "$ID" in
  debian) pkgs+=(linux-perf) ;;
  # Ubuntu ships Chromium as chromium-browser (a deb that installs the snap).
  ubuntu) pkgs=("${pkgs[@]/#chromium/chromium-browser}"); pkgs+=(linux-tools-common "linux-tools-$(uname -r)" "linux-headers-$(uname -r)") ;;
  *) echo "setup-system: unsupported distribution '$ID' (Debian 12 or Ubuntu 24.04 expected)" >&2; exit 2 ;;
esac

# npm installs the readers the export tests check profkit's files with (tests/js, run by
# nodejs): the distribution's npm, unless an npm came with the installed nodejs already
# (Debian's npm package would replace such a nodejs)
if ! command -v npm >/dev/null 2>&1; then
  pkgs+=(npm)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-system: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # linux-tools-$(uname -r) may not exist for a custom kernel: fall back to generic
  if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    if [ "$ID" = ubuntu ]; then
      filtered=()
      for p in "${missing[@]}"; do case "$p" in linux-tools-6*|linux-headers-6*) ;; *) filtered+=("$p");; esac; done
      $SUDO apt-get install -y -qq --no-install-recommends "${filtered[@]}" linux-tools-generic
    else
      exit 1
    fi
  fi
else
  echo "setup-system: all ${#pkgs[@]} packages present"
fi

# tracefs must be mounted or bcc cannot detach uprobes cleanly.
if [ "$(id -u)" = 0 ] && [ -d /sys/kernel/tracing ] && ! mountpoint -q /sys/kernel/tracing; then
  mount -t tracefs nodev /sys/kernel/tracing || echo "setup-system: could not mount tracefs (uprobes may fail to detach)" >&2
fi
# perf needs these relaxed to profile other users' processes (postgres runs as another user).
if [ "$(id -u)" = 0 ]; then
  sysctl -qw kernel.perf_event_paranoid=-1 2>/dev/null || true
  sysctl -qw kernel.kptr_restrict=0 2>/dev/null || true
fi
echo "setup-system: done ($PRETTY_NAME)"
