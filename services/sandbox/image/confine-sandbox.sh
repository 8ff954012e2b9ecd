#!/bin/sh
# The Docker backend's entrypoint: confine the sandbox's network, then become the sandbox user for good.
#
# Runs as root with only NET_ADMIN (the routes) and SETUID, SETGID, SETPCAP (the drop below), before any code of
# a session can run: the routing table is left with a single host route to the executor ($1), so there is no
# default route (no internet, no metadata address) and no route to another sandbox on the shared bridge; the
# loopback range but 127.0.0.1 is removed, so the engine's resolver at 127.0.0.11 is out of reach and a name
# lookup (pip install, requests.get) fails at once instead of waiting out its timeouts. IPv6 is left with no
# address and no route at all (a link-local address would reach the bridge's other members; an engine whose
# kernel has no IPv6 has nothing to flush). Then it replaces itself
# (process 1 stays process 1) by tini and the kernel gateway as uid 1000 with every capability gone from every
# set, the bounding set included, and no_new_privs: nothing in the sandbox keeps or can regain a capability.
set -eu
peer="$1"
ip route flush table main
ip route add "$peer/32" dev eth0
ip route del local 127.0.0.0/8 dev lo table local
if [ -d /proc/sys/net/ipv6 ]; then
  ip -6 addr flush dev eth0
  ip -6 addr flush dev lo
  ip -6 route flush table all
fi
exec setpriv --reuid=1000 --regid=1000 --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs \
  -- /usr/bin/tini -- /usr/local/bin/start-sandbox
