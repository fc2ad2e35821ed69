#!/usr/bin/env bash
# A local two-node Slurm cluster on this machine, for developers and tests (docs/cluster.md "A local Slurm").
#
#   tools/local-slurm.sh start  [--dir D] [--sites]   start munged, slurmctld and two slurmd (nodes n1, n2)
#   tools/local-slurm.sh stop   [--dir D]             stop them all and remove what start made (namespaces, veths)
#   tools/local-slurm.sh status [--dir D]             what runs, and sinfo
#   tools/local-slurm.sh env    [--dir D]             print the environment a caller needs (SLURM_CONF=...)
#
# Root, no systemd: every daemon runs in the foreground-less way (pid files) with its state, logs, munge key and
# socket under D (default /tmp/fl-local-slurm), so that several clusters (other checkouts, other tests) can run
# side by side on free ports. One partition "debug" holding both nodes (select/cons_tres by core,
# proctrack/linuxproc, no cgroups, no accounting); each node claims 16 CPUs whatever the machine has
# (SlurmdParameters=config_overrides), so that a test can place a server and a few clients on two cores.
#
# --sites: each slurmd runs in its own network namespace, joined to the host by a veth pair (10.216.K.1 on the
# host, 10.216.K.2 in the namespace), so that the two nodes stand for two sites with different addresses; the
# host forwards between them (net.ipv4.ip_forward=1 while the cluster runs, restored by stop).
#
# The packages (slurmctld, slurmd, slurm-client, munge) come from deploy/install-deps.sh --slurm, which start
# runs when one is missing.
set -euo pipefail

die() { echo "local-slurm: $*" >&2; exit 1; }

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

CMD="${1:-}"
[[ -n "$CMD" ]] || usage
shift
DIR=/tmp/fl-local-slurm
SITES=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) [[ $# -ge 2 ]] || die "--dir needs a directory"; DIR="$2"; shift 2 ;;
    --dir=*) DIR="${1#--dir=}"; shift ;;
    --sites) SITES=1; shift ;;
    -h|--help) usage ;;
    *) die "unknown argument '$1' (start|stop|status|env [--dir D] [--sites])" ;;
  esac
done
[[ "$DIR" == /* ]] || DIR="$(pwd)/$DIR"
HERE="$(cd "$(dirname "$0")" && pwd)"
SBIN=/usr/sbin

need_root() { [[ "$(id -u)" -eq 0 ]] || die "$1 needs root (slurmd runs jobs as their users; namespaces); run as root"; }

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Free TCP ports from the kernel (bound to port 0 and released): controller, n1, n2.
free_ports() {
  python3 - <<'EOF'
import socket
socks = []
for _ in range(3):
    s = socket.socket(); s.bind(("", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

print_env() {
  [[ -f "$DIR/slurm.conf" ]] || die "no cluster in $DIR (run: $0 start --dir $DIR)"
  echo "export SLURM_CONF=$DIR/slurm.conf"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...
  local secs="$1" what="$2"; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [[ $SECONDS -lt $end ]] || return 1
    sleep 0.1
  done
  [[ -n "$what" ]] || true
}

stop_cluster() {
  [[ -d "$DIR" ]] || { echo "local-slurm: nothing in $DIR"; return 0; }
  local f pid
  for f in "$DIR"/slurmd-n1.pid "$DIR"/slurmd-n2.pid "$DIR"/slurmctld.pid "$DIR"/munged.pid; do
    pid_alive "$f" || continue
    pid="$(cat "$f")"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  # Job steps that outlived their slurmd (slurmstepd and what it ran) are this cluster's: their spool is ours.
  for pid in $(pgrep -f "slurmstepd" 2>/dev/null || true); do
    if tr '\0' ' ' <"/proc/$pid/environ" 2>/dev/null | grep -q "SLURM_CONF=$DIR/slurm.conf"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  if [[ -f "$DIR/sites" ]]; then
    # shellcheck disable=SC1091
    . "$DIR/sites"
    for ns in $NAMESPACES; do
      # Whatever still runs in the namespace (a step's children) goes with it.
      for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -KILL "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    done
    for v in $HOST_VETHS; do ip link del "$v" 2>/dev/null || true; done
    [[ "${IP_FORWARD_BEFORE:-1}" == "1" ]] || sysctl -qw net.ipv4.ip_forward=0 || true
    rm -f "$DIR/sites"
  fi
  rm -f "$DIR"/*.pid "$DIR/munge.socket" "$DIR/munge.socket.lock"
  echo "local-slurm: stopped the cluster in $DIR"
}

start_cluster() {
  need_root start
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null &&
    command -v sbatch >/dev/null || "$HERE/../deploy/install-deps.sh" --slurm ||
    die "Slurm is not installed and deploy/install-deps.sh --slurm failed (see above)"
  if pid_alive "$DIR/slurmctld.pid"; then
    die "a cluster already runs in $DIR (stop it first: $0 stop --dir $DIR)"
  fi
  stop_cluster >/dev/null  # leftovers of a cluster that was killed
  mkdir -p "$DIR"/{state,log,spool/n1,spool/n2,munge}
  chmod 700 "$DIR/munge"
  local me
  me="$(hostname -s)"

  # munge: a key of our own and a socket of our own (not /run/munge), so that nothing of the host's is used.
  if [[ ! -s "$DIR/munge/munge.key" ]]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  chmod 400 "$DIR/munge/munge.key"
  munged --force --key-file "$DIR/munge/munge.key" --socket "$DIR/munge.socket" --pid-file "$DIR/munged.pid" \
    --log-file "$DIR/log/munged.log" --seed-file "$DIR/munge/munge.seed" ||
    die "munged did not start; its log: $DIR/log/munged.log"
  wait_for 5 "" test -S "$DIR/munge.socket" || die "munged made no socket $DIR/munge.socket; see $DIR/log/munged.log"

  local ctl_port p1 p2 ctl_addr a1 a2
  read -r ctl_port p1 p2 <<<"$(free_ports)"
  ctl_addr=127.0.0.1 a1=127.0.0.1 a2=127.0.0.1
  local ns1="" ns2=""
  if [[ "$SITES" -eq 1 ]]; then
    # A free 10.216.K.0/24 pair of subnets (K, K+1) for this cluster's two veths.
    local k=1
    while ip -4 addr show | grep -q "10\.216\.$k\.1/" || ip -4 addr show | grep -q "10\.216\.$((k + 1))\.1/"; do
      k=$((k + 2))
      [[ $k -lt 250 ]] || die "no free 10.216.K.0/24 subnets for --sites"
    done
    local tag
    tag="$(printf '%s' "$DIR" | md5sum | cut -c1-6)"
    ns1="fl-slurm-$tag-n1" ns2="fl-slurm-$tag-n2"
    local forward_before
    forward_before="$(sysctl -n net.ipv4.ip_forward)"
    cat >"$DIR/sites" <<EOF
NAMESPACES="$ns1 $ns2"
HOST_VETHS="fs$tag-1 fs$tag-2"
IP_FORWARD_BEFORE=$forward_before
EOF
    local i sub ns
    for i in 1 2; do
      sub=$((k + i - 1))
      ns="fl-slurm-$tag-n$i"
      ip netns add "$ns"
      ip link add "fs$tag-$i" type veth peer name "fs$tag-${i}n"
      ip link set "fs$tag-${i}n" netns "$ns"
      ip addr add "10.216.$sub.1/24" dev "fs$tag-$i"
      ip link set "fs$tag-$i" up
      ip -n "$ns" addr add "10.216.$sub.2/24" dev "fs$tag-${i}n"
      ip -n "$ns" link set "fs$tag-${i}n" up
      ip -n "$ns" link set lo up
      ip -n "$ns" route add default via "10.216.$sub.1"
    done
    sysctl -qw net.ipv4.ip_forward=1
    a1="10.216.$k.2" a2="10.216.$((k + 1)).2"
    ctl_addr="10.216.$k.1"  # the host, reachable from both namespaces through their default routes
  fi

  cat >"$DIR/slurm.conf" <<EOF
# Written by tools/local-slurm.sh start --dir $DIR$([[ "$SITES" -eq 1 ]] && echo " --sites")
ClusterName=fl-local
SlurmctldHost=$me($ctl_addr)
SlurmctldPort=$ctl_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=30
NodeName=n1 NodeHostname=$me NodeAddr=$a1 Port=$p1 CPUs=16 RealMemory=4000 State=UNKNOWN
NodeName=n2 NodeHostname=$me NodeAddr=$a2 Port=$p2 CPUs=16 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$DIR/slurm.conf"
  "$SBIN/slurmctld" -i -f "$SLURM_CONF" || die "slurmctld did not start; its log: $DIR/log/slurmctld.log"
  if [[ "$SITES" -eq 1 ]]; then
    # nsenter, not `ip netns exec`: that one mounts a fresh /sys without /sys/fs/cgroup, where slurmd refuses to
    # start ("Unable to initialize cgroup plugin").
    nsenter --net="/run/netns/$ns1" "$SBIN/slurmd" -N n1 -f "$SLURM_CONF" || die "slurmd n1 did not start; see $DIR/log/slurmd-n1.log"
    nsenter --net="/run/netns/$ns2" "$SBIN/slurmd" -N n2 -f "$SLURM_CONF" || die "slurmd n2 did not start; see $DIR/log/slurmd-n2.log"
  else
    "$SBIN/slurmd" -N n1 -f "$SLURM_CONF" || die "slurmd n1 did not start; see $DIR/log/slurmd-n1.log"
    "$SBIN/slurmd" -N n2 -f "$SLURM_CONF" || die "slurmd n2 did not start; see $DIR/log/slurmd-n2.log"
  fi
  # Ready when both nodes are idle.
  if ! wait_for 30 "" bash -c "[[ \$(sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle') -eq 2 ]]"; then
    sinfo -N 2>&1 || true
    die "the nodes did not come up idle within 30 s; logs in $DIR/log"
  fi
  echo "local-slurm: two nodes (n1 $a1:$p1, n2 $a2:$p2), controller $ctl_addr:$ctl_port, partition debug, in $DIR"
  print_env
}

case "$CMD" in
  start) start_cluster ;;
  stop) need_root stop; stop_cluster ;;
  status)
    for d in munged slurmctld slurmd-n1 slurmd-n2; do
      if pid_alive "$DIR/$d.pid"; then echo "$d: running (pid $(cat "$DIR/$d.pid"))"; else echo "$d: not running"; fi
    done
    if [[ -f "$DIR/slurm.conf" ]]; then SLURM_CONF="$DIR/slurm.conf" sinfo -N 2>&1 || true; fi
    ;;
  env) print_env ;;
  *) usage ;;
esac
