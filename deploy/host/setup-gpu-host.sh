#!/usr/bin/env bash
# setup-gpu-host.sh: prepare a RHEL 8 / Rocky Linux 8 / AlmaLinux 8 host with an NVIDIA GPU to
# run recsys (Triton with the GPU through CDI, Redis and the API, under Podman and systemd).
# deploy/host/README.md describes every step and what to check afterwards.
#
# Idempotent: each step first looks at the host and changes only what is not right yet, so a
# second run after a successful one changes nothing and reports every step "ok".
#
# Usage: setup-gpu-host.sh [--dry-run] [--root DIR] [--force]
#   --dry-run   say, step by step, what is already right ("ok") and what would change
#               ("would"), and change nothing
#   --root DIR  read and write files under DIR instead of / (for tests, or to look at an
#               image); commands still act on the running host
#   --force     run on a host that is not of the RHEL 8 family
#
# Exit status: 0 done; 3 done so far, but a reboot is needed first (nouveau still loaded, or
# the NVIDIA driver not loaded yet): reboot, then run it again; 1 a step failed; 2 bad usage,
# or not a RHEL 8 family host.
set -euo pipefail
# Byte order for globs and sorting, whatever the caller's locale.
export LC_ALL=C

readonly PROFILE=latency-performance
readonly DROPIN=/etc/systemd/system/recsys-triton.service.d/10-numa.conf
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=/
dry_run=0
force=0
reboot_reasons=()
have_config_manager=0

usage() {
  sed -n '/^# Usage:/,/^# or not a RHEL/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

die() {
  echo "setup-gpu-host: $*" >&2
  exit 1
}

# Bad usage, or a host this script is not for.
refuse() {
  echo "setup-gpu-host: $*" >&2
  exit 2
}

while [ "$#" -gt 0 ]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --force) force=1 ;;
    --root)
      [ "$#" -ge 2 ] || refuse "--root needs a directory"
      root=$2
      shift
      ;;
    --root=*) root=${1#--root=} ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) refuse "unknown argument: $1 (see --help)" ;;
  esac
  shift
done
[ -d "$root" ] || refuse "--root $root is not a directory"
# Every file path below is "$R/etc/...": R is empty for the real root.
R=$(cd "$root" && pwd)
[ "$R" = / ] && R=

# Every external command runs through one of these two, by its name on PATH (so that a test
# can put stubs first on PATH). query only reads and always runs; a change runs only outside
# --dry-run.
query() {
  "$@"
}

report() {
  printf '%-7s %-9s %s\n' "$1" "$2" "$3"
}

ok() {
  report ok "$1" "$2"
}

# change STEP DESCRIPTION COMMAND...: say what changes, and change it (unless --dry-run).
change() {
  local step=$1 what=$2
  shift 2
  if [ "$dry_run" = 1 ]; then
    report would "$step" "$what"
    return 0
  fi
  report change "$step" "$what"
  "$@" || die "step $step failed: $*"
}

need_reboot() {
  report reboot "$1" "$2"
  reboot_reasons+=("$2")
}

installed() {
  query rpm -q "$@" >/dev/null 2>&1
}

# The value of KEY in os-release, without quotes; nothing when it is absent.
os_field() {
  local line value
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in
      "$1="*)
        value=${line#*=}
        value=${value#[\"\']}
        value=${value%[\"\']}
        printf '%s\n' "$value"
        return 0
        ;;
    esac
  done <"$R/etc/os-release"
}

step_os() {
  [ -r "$R/etc/os-release" ] || refuse "cannot read $R/etc/os-release"
  os_id=$(os_field ID)
  local like version name
  like=$(os_field ID_LIKE)
  version=$(os_field VERSION_ID)
  name=$(os_field PRETTY_NAME)
  [ -n "$name" ] || name="$(os_field NAME) $version"
  case " $os_id $like " in
    *" rhel "* | *" rocky "* | *" almalinux "* | *" centos "*)
      if [ "${version%%.*}" = 8 ]; then
        ok os "$name"
        return 0
      fi
      ;;
  esac
  if [ "$force" = 1 ]; then
    report warn os "$name is not RHEL 8, Rocky 8 or Alma 8: going on (--force)"
    return 0
  fi
  refuse "$name is not RHEL 8, Rocky Linux 8 or AlmaLinux 8: the driver, repository \
and SELinux steps are written for that family only (--force to run anyway)"
}

# Writes the blacklist, then rebuilds the initramfs so that early boot leaves nouveau out too.
# If dracut fails the old file comes back, so that the next run tries again.
install_blacklist() {
  local src=$1 dest=$2 backup=""
  if [ -e "$dest" ]; then
    backup=$(mktemp) && cp -p "$dest" "$backup" || return 1
  fi
  install -D -m 0644 "$src" "$dest" || return 1
  if ! dracut --force; then
    if [ -n "$backup" ]; then
      mv "$backup" "$dest"
    else
      rm -f "$dest"
    fi
    return 1
  fi
  [ -z "$backup" ] || rm -f "$backup"
}

step_nouveau() {
  local file=/etc/modprobe.d/blacklist-nouveau.conf
  if cmp -s "$here/modprobe.d/blacklist-nouveau.conf" "$R$file"; then
    ok nouveau "$file is in place"
  else
    change nouveau "write $file, then rebuild the initramfs (dracut --force)" \
      install_blacklist "$here/modprobe.d/blacklist-nouveau.conf" "$R$file"
  fi
  if grep -q '^nouveau ' <<<"$modules"; then
    need_reboot nouveau "the nouveau module is loaded"
  fi
}

step_epel() {
  # The driver's DKMS packages need dkms, which comes from EPEL.
  if installed epel-release; then
    ok epel "epel-release is installed"
  elif [ "$os_id" = rhel ]; then
    change epel "install EPEL (dkms for the driver)" dnf install -y \
      https://dl.fedoraproject.org/pub/epel/epel-release-latest-8.noarch.rpm
  else
    change epel "install EPEL (dkms for the driver): dnf install -y epel-release" \
      dnf install -y epel-release
  fi
}

# add_repo STEP URL: a dnf repository from its .repo file, once.
add_repo() {
  local step=$1 url=$2
  local file=/etc/yum.repos.d/${url##*/}
  if [ -e "$R$file" ]; then
    ok "$step" "$file is in place"
    return 0
  fi
  if [ "$have_config_manager" = 0 ] && ! installed dnf-plugins-core; then
    change "$step" "install dnf-plugins-core (dnf config-manager)" \
      dnf install -y dnf-plugins-core
  fi
  have_config_manager=1
  change "$step" "add the repository $url" dnf config-manager --add-repo "$url"
}

# install_packages STEP WHY PACKAGE...
install_packages() {
  local step=$1 why=$2
  shift 2
  if installed "$@"; then
    ok "$step" "$* installed"
  else
    change "$step" "install $* ($why)" dnf install -y "$@"
  fi
}

step_driver() {
  local arch kernel
  arch=$(query uname -m)
  case $arch in
    x86_64) ;;
    aarch64) arch=sbsa ;;
    *) die "no NVIDIA CUDA repository for the architecture $arch" ;;
  esac
  add_repo cuda-repo "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/$arch/cuda-rhel8.repo"
  # DKMS builds the driver against the running kernel's kernel-devel (kernel-headers is the
  # userspace one, which need not match).
  kernel=$(query uname -r)
  install_packages kernel "the driver is built against them" "kernel-devel-$kernel" kernel-headers
  install_packages driver "the NVIDIA driver, built by DKMS" cuda-drivers
  local secure_boot=""
  if command -v mokutil >/dev/null; then
    secure_boot=$(query mokutil --sb-state 2>/dev/null || true)
  fi
  if [[ $secure_boot == *"SecureBoot enabled"* ]]; then
    report warn driver "Secure Boot is on: sign the nvidia module (mokutil --import) or it will \
not load (\"Operation not permitted\")"
  fi
  if [ -r "$R/sys/module/nvidia/version" ]; then
    ok driver "the nvidia module $(<"$R/sys/module/nvidia/version") is loaded"
  else
    need_reboot driver "the nvidia module is not loaded"
  fi
}

step_podman() {
  install_packages podman "runs the containers" podman
  local version
  version=$(query podman --version 2>/dev/null || true)
  version=${version##* }
  [ -n "$version" ] || return 0
  if [ "$(printf '%s\n' 4.9 "$version" | sort -V | head -n1)" = 4.9 ]; then
    ok podman "Podman $version: use the quadlets in deploy/quadlet"
  else
    ok podman "Podman $version (older than 4.9): use the plain units in deploy/systemd"
  fi
}

step_toolkit() {
  add_repo toolkit https://nvidia.github.io/libnvidia-container/stable/rpm/nvidia-container-toolkit.repo
  install_packages toolkit "nvidia-ctk, for the CDI spec" nvidia-container-toolkit
}

step_selinux() {
  if ! query selinuxenabled; then
    ok selinux "SELinux is off: no boolean to set"
    return 0
  fi
  if [[ $(query getsebool container_use_devices) == *"--> on" ]]; then
    ok selinux "container_use_devices is on"
  else
    change selinux "let containers use devices, the GPU (setsebool -P container_use_devices on)" \
      setsebool -P container_use_devices on
  fi
}

step_sysctl() {
  local file=/etc/sysctl.d/90-recsys.conf key value path now
  local stale=()
  if cmp -s "$here/sysctl.d/90-recsys.conf" "$R$file"; then
    ok sysctl "$file is in place"
  else
    change sysctl "write $file" install -D -m 0644 "$here/sysctl.d/90-recsys.conf" "$R$file"
  fi
  while IFS='=' read -r key value; do
    key=${key//[[:space:]]/}
    value=${value//[[:space:]]/}
    case $key in '' | '#'*) continue ;; esac
    path=$R/proc/sys/${key//.//}
    # A kernel without the setting (no NUMA balancing, say) has nothing to change.
    [ -r "$path" ] || continue
    now=$(<"$path")
    [ "$now" = "$value" ] || stale+=("$key=$value (now $now)")
  done <"$here/sysctl.d/90-recsys.conf"
  if [ "${#stale[@]}" = 0 ]; then
    ok sysctl "the settings of $file are in effect"
  else
    change sysctl "apply ${stale[*]}" sysctl -q -e -p "$R$file"
  fi
}

step_tuned() {
  install_packages tuned "sets the CPU governor" tuned
  if query systemctl is-enabled --quiet tuned && query systemctl is-active --quiet tuned; then
    ok tuned "tuned is enabled and running"
  else
    change tuned "enable and start tuned" systemctl enable --now tuned
  fi
  # latency-performance: the performance governor and no deep C-states, against the p99
  # jitter of frequency changes and wake-ups.
  local active
  active=$(query tuned-adm active 2>/dev/null || true)
  if grep -qx "Current active profile: $PROFILE" <<<"$active"; then
    ok tuned "the active profile is $PROFILE"
  else
    change tuned "switch to the tuned profile $PROFILE (performance governor)" \
      tuned-adm profile "$PROFILE"
  fi
}

step_cdi() {
  local spec=/etc/cdi/nvidia.yaml driver
  if [ ! -r "$R/sys/module/nvidia/version" ]; then
    report later cdi "$spec: generated once the nvidia module is loaded (after the reboot)"
    return 0
  fi
  driver=$(<"$R/sys/module/nvidia/version")
  # The spec names the driver's libraries by version: after a driver update it must be made
  # again, or containers fail to start.
  if [ -r "$R$spec" ] && grep -qF "$driver" "$R$spec"; then
    ok cdi "$spec is for driver $driver"
  else
    change cdi "generate $spec for driver $driver (nvidia-ctk cdi generate)" \
      nvidia-ctk cdi generate --output="$R$spec"
  fi
}

write_dropin() {
  mkdir -p "$(dirname "$1")" && printf '%s\n' "$2" >"$1" && systemctl daemon-reload
}

step_numa() {
  local dev node cpus content first=""
  local nodes=()
  # NVIDIA display and 3D controllers in PCI bus order, nvidia-smi's order: the first is GPU 0,
  # where ranking_model's instances run (gpus: [0] in its config.pbtxt).
  for dev in "$R"/sys/bus/pci/devices/*; do
    [ -r "$dev/vendor" ] && [ -r "$dev/class" ] || continue
    [ "$(<"$dev/vendor")" = 0x10de ] || continue
    case $(<"$dev/class") in 0x0300* | 0x0302*) ;; *) continue ;; esac
    node=-1
    [ -r "$dev/numa_node" ] && node=$(<"$dev/numa_node")
    [ -n "$first" ] || first=$node
    [[ " ${nodes[*]} " == *" $node "* ]] || nodes+=("$node")
  done
  if [ -z "$first" ]; then
    report skip numa "no NVIDIA GPU under /sys/bus/pci/devices: Triton is not pinned"
    return 0
  fi
  node=$first
  if [ "$node" -lt 0 ]; then
    ok numa "GPU 0 reports no NUMA node (one-node host): nothing to pin"
    return 0
  fi
  if [ "${#nodes[@]}" -gt 1 ]; then
    report note numa "GPUs on NUMA nodes ${nodes[*]}: Triton goes with GPU 0, on node $node"
  fi
  cpus=$(<"$R/sys/devices/system/node/node$node/cpulist")
  content="# Written by deploy/host/setup-gpu-host.sh: Triton on its GPU's NUMA node ($node), its
# threads on that node's CPUs and its memory from that node's RAM. The container's processes
# inherit both from the service.
[Service]
CPUAffinity=$cpus
NUMAPolicy=bind
NUMAMask=$node"
  if [ -r "$R$DROPIN" ] && [ "$(<"$R$DROPIN")" = "$content" ]; then
    ok numa "$DROPIN pins Triton to node $node (CPUs $cpus)"
  else
    change numa "pin Triton to NUMA node $node, CPUs $cpus ($DROPIN, daemon-reload)" \
      write_dropin "$R$DROPIN" "$content"
  fi
}

os_id=
step_os
modules=$(query lsmod)
step_nouveau
step_epel
step_driver
step_podman
step_toolkit
step_selinux
step_sysctl
step_tuned
step_cdi
step_numa

if [ "${#reboot_reasons[@]}" -gt 0 ]; then
  if [ "$dry_run" = 1 ]; then
    echo "A reboot will be needed: ${reboot_reasons[*]}."
    exit 0
  fi
  echo "Reboot now (${reboot_reasons[*]}), then run this script again."
  exit 3
fi
if [ "$dry_run" = 1 ]; then
  echo "Dry run: nothing was changed."
else
  echo "Done."
fi
