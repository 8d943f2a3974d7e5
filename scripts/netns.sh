#!/usr/bin/env bash
# Emulated hosts on one machine, with real network links between them.
#
#   scripts/netns.sh up N [--rate 1gbit] [--rails R] [--prefix P]   make N "hosts", print them as JSON
#   scripts/netns.sh down P                             remove everything prefix P made
#   NETNS_PREFIX=P scripts/netns.sh rsh ADDR CMD...     run CMD on the host with address ADDR
#
# `up` creates network namespaces P-h0 .. P-h(N-1) (the hosts) and P-hub (a switch): each host
# has its loopback up and one veth interface, veth0, addressed 10.77.0.(i+1)/24; the other end,
# h<i>, sits in P-hub on the bridge br0. With --rate every veth end (both directions) gets a tc
# token-bucket filter (tbf; netem is not available everywhere) at that rate, so inter-host links
# are far slower than shared memory, as between real machines. With --rails R (default 1) every
# host has R such links, veth0 .. veth(R-1), rail r on its own bridge br<r> in P-hub and its own
# subnet 10.77.r.0/24 (host i is 10.77.r.(i+1)), each rate-limited on its own: R NICs per host on
# a rail-optimised fabric. A connection leaves through the rail of the address it goes to. Nothing is created in the calling
# namespace: addresses cannot clash with the machine's own, and parallel runs with different
# prefixes (the default is cl<pid>) do not collide. Run a process on host i with
#   ip netns exec P-h<i> CMD
# Note: namespaces share the hostname, so give ranks COMMLIB_HOST_ID (e.g. the namespace name)
# and COMMLIB_SOCKET_IFNAME=veth0; commlib.testing.netns does both.
#
# `rsh` is a launch agent for Open MPI's rsh launcher (--mca plm_rsh_agent "scripts/netns.sh rsh",
# --host 10.77.0.1:2,10.77.0.2:2, mpirun itself started on host 0): where mpirun would ssh to a
# machine, it starts the daemon in that host's namespace instead, so MPI runs as across machines.
#
# `up` with a prefix that already exists replaces it; `down` of a prefix that is gone does
# nothing. Both need root (CAP_NET_ADMIN); a failure to create a namespace exits non-zero with
# the reason, after removing whatever was made.
set -euo pipefail

SUBNET=10.77.0   # rail 0; rail r is 10.77.r

usage() {
  echo "usage: $0 up N [--rate RATE] [--rails R] [--prefix P]  |  $0 down P  |  NETNS_PREFIX=P $0 rsh ADDR CMD..." >&2
  echo "  RATE: <int>bit|kbit|mbit|gbit (e.g. 1gbit); P: [A-Za-z0-9_]{1,16}" >&2
  exit 2
}

die() { echo "netns.sh: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "must run as root (it creates network namespaces and veth links); try sudo $0 $*"
  command -v ip >/dev/null || die "the 'ip' command (iproute2) is not installed"
}

check_prefix() {
  [[ "$1" =~ ^[A-Za-z0-9_]{1,16}$ ]] || die "prefix: expected 1-16 of [A-Za-z0-9_], got '$1'"
}

# The namespaces with this exact prefix (P-...), one per line.
namespaces_of() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(hub|h[0-9]+)\$" || true
}

down() {
  local prefix=$1 ns
  check_prefix "$prefix"
  need_root down "$prefix"
  # Deleting a namespace deletes the veth ends (and with them their peers) and qdiscs inside it.
  for ns in $(namespaces_of "$prefix"); do
    ip netns delete "$ns" 2>/dev/null || true
  done
  [ -z "$(namespaces_of "$prefix")" ] || die "could not remove: $(namespaces_of "$prefix" | tr '\n' ' ')"
}

# Bits per second of a tc-style rate, or an error.
rate_bits() {
  [[ "$1" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || die "--rate: expected <int>bit|kbit|mbit|gbit, got '$1'"
  local n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
  case $unit in
    bit) echo "$n" ;; kbit) echo $((n * 1000)) ;; mbit) echo $((n * 1000000)) ;; gbit) echo $((n * 1000000000)) ;;
  esac
}

limit() {  # limit NS DEV RATE BURST
  tc -n "$1" qdisc replace dev "$2" root tbf rate "$3" burst "$4" latency 50ms
}

up() {
  local n=$1; shift
  local rate="" prefix="cl$$" rails=1
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] || die "N: expected 1..250 hosts, got '$n'"
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) [ $# -ge 2 ] || usage; rate=$2; shift 2 ;;
      --rails) [ $# -ge 2 ] || usage; rails=$2; shift 2 ;;
      --prefix) [ $# -ge 2 ] || usage; prefix=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  check_prefix "$prefix"
  [[ "$rails" =~ ^[0-9]+$ ]] && [ "$rails" -ge 1 ] && [ "$rails" -le 8 ] || die "--rails: expected 1..8, got '$rails'"
  local burst=""
  if [ -n "$rate" ]; then
    # The bucket must hold a few GSO super-packets (64 KiB each) and ~4 ms at the rate, or tbf
    # drops what it cannot ever pass and throughput collapses.
    rate_bits "$rate" >/dev/null  # dies here on a bad rate (in $(...) below it could not)
    local bytes=$(( $(rate_bits "$rate") / 8 / 250 ))
    [ "$bytes" -ge 262144 ] || bytes=262144
    burst=$bytes
  fi
  need_root up "$n"
  down "$prefix"
  # Whatever stops us half-way (a failed command, die, a signal) removes what was made.
  trap 'down "$prefix" >/dev/null 2>&1 || true' EXIT
  trap 'exit 130' INT TERM
  local hub="$prefix-hub" i r ns port dev
  ip netns add "$hub" || die "cannot create network namespaces here (ip netns add failed)"
  ip -n "$hub" link set lo up
  for ((r = 0; r < rails; r++)); do
    ip -n "$hub" link add "br$r" type bridge
    ip -n "$hub" link set "br$r" up
  done
  local json="" sep=""
  for ((i = 0; i < n; i++)); do
    ns="$prefix-h$i"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    local ifnames="" addrs="" rsep=""
    for ((r = 0; r < rails; r++)); do
      port="h$i"; [ "$r" = 0 ] || port="h${i}r$r"  # rail 0 keeps the single-rail names
      dev="veth$r"
      ip -n "$hub" link add "$port" type veth peer name "$dev" netns "$ns"
      ip -n "$hub" link set "$port" master "br$r" up
      ip -n "$ns" addr add "10.77.$r.$((i + 1))/24" dev "$dev"
      ip -n "$ns" link set "$dev" up
      if [ -n "$rate" ]; then
        limit "$ns" "$dev" "$rate" "$burst"     # what host i sends on rail r
        limit "$hub" "$port" "$rate" "$burst"   # what host i receives on rail r
      fi
      ifnames+="$rsep\"$dev\""; addrs+="$rsep\"10.77.$r.$((i + 1))\""; rsep=", "
    done
    json+="$sep{\"index\": $i, \"netns\": \"$ns\", \"ifname\": \"veth0\", \"addr\": \"$SUBNET.$((i + 1))\", \"hub_port\": \"h$i\","
    json+=" \"ifnames\": [$ifnames], \"addrs\": [$addrs]}"
    sep=", "
  done
  trap - EXIT INT TERM
  echo "{\"prefix\": \"$prefix\", \"hub\": \"$hub\", \"bridge\": \"br0\", \"subnet\": \"$SUBNET.0/24\"," \
       "\"rate\": \"${rate:-none}\", \"rails\": $rails, \"hosts\": [$json]}"
}

rsh() {
  local addr=$1; shift
  local prefix=${NETNS_PREFIX:-}
  check_prefix "$prefix"
  [[ "$addr" =~ ^${SUBNET//./\\.}\.([0-9]+)$ ]] || die "rsh: $addr is not a host address ($SUBNET.N)"
  local ns="$prefix-h$((BASH_REMATCH[1] - 1))"
  ip netns list | awk '{print $1}' | grep -qx "$ns" || die "rsh: no namespace $ns for $addr"
  exec ip netns exec "$ns" /bin/sh -c "$*"
}

[ $# -ge 1 ] || usage
cmd=$1; shift
case $cmd in
  up) [ $# -ge 1 ] || usage; up "$@" ;;
  down) [ $# -eq 1 ] || usage; down "$1" ;;
  rsh) [ $# -ge 2 ] || usage; rsh "$@" ;;
  *) usage ;;
esac
