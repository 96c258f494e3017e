#!/usr/bin/env bash
# Install Debian packages: `bash scripts/apt-install.sh WHO PACKAGE...` (WHO names the caller in messages).
# The set-up and the cluster build may run side by side, and apt takes one run at a time: ours queue on a lock
# of their own, and wait (up to 10 minutes) for any other apt run, such as unattended-upgrades, to end.
set -euo pipefail
who=$1; shift
[ $# -gt 0 ] || exit 0
die() { printf '\033[1m[%s]\033[0m %s\n' "$who" "$*" >&2; exit 1; }
command -v apt-get >/dev/null 2>&1 || die "missing $*: no apt-get here, install them by hand"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "missing $*: run as root or install them"
  sudo=sudo
fi
printf '\033[1m[%s]\033[0m installing from apt: %s\n' "$who" "$*" >&2
exec 9>"${TMPDIR:-/tmp}/hvdk8s-apt.lock"
flock 9
# `apt-get update` does not wait for the lists' lock (DPkg::Lock::Timeout is only the install's): retried here.
err=$(mktemp)
trap 'rm -f "$err"' EXIT
deadline=$((SECONDS + 600))
until $sudo apt-get update -qq 2>"$err"; do
  grep -q "Could not get lock" "$err" && [ $SECONDS -lt $deadline ] || { cat "$err" >&2; die "apt-get update failed"; }
  sleep 2
done
DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >/dev/null
