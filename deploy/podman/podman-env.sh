# shellcheck shell=bash
# Sourced by deploy/podman's scripts: the Podman settings they run with. A caller's own
# CONTAINERS_CONF wins; otherwise Podman reads a containers.conf written here, under
# ${VDET_PODMAN_CONF_DIR:-/tmp/vdet-podman-<uid>}, and never /etc/containers or
# ~/.config/containers (CONTAINERS_CONF replaces those files, it does not add to them).
#
# Why each setting, as found on a Debian 12 host with cgroups v1 and v2 mounted side by side:
# - runtime runc: crun refuses such hybrid cgroups;
# - cgroup_manager cgroupfs: no systemd needed (also why health checks are run on demand, with
#   `podman healthcheck run`: Podman schedules them with systemd timers);
# - events_logger file: no journald needed;
# - default_ulimits: Podman's defaults ask for more open files and processes than a process
#   may raise itself to, and runc then fails with "error setting rlimits"; ask for the hard
#   limit of open files this shell has, and for 4096 processes.
if [[ -z "${CONTAINERS_CONF:-}" ]]; then
  vdet_podman_conf_dir=${VDET_PODMAN_CONF_DIR:-${TMPDIR:-/tmp}/vdet-podman-$(id -u)}
  mkdir -p "$vdet_podman_conf_dir"
  vdet_podman_nofile=$(ulimit -Hn)
  [[ $vdet_podman_nofile == unlimited ]] && vdet_podman_nofile=1048576
  cat >"$vdet_podman_conf_dir/containers.conf" <<EOF
# Written by deploy/podman/podman-env.sh; see there for why.
[containers]
default_ulimits = ["nofile=$vdet_podman_nofile:$vdet_podman_nofile", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  export CONTAINERS_CONF="$vdet_podman_conf_dir/containers.conf"
  unset vdet_podman_conf_dir vdet_podman_nofile
fi
