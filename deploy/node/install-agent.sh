#!/bin/sh
# Installs the inplace-agent binary for this node's architecture (`uname -m`: x86_64 -> amd64, aarch64 ->
# arm64; others are refused), at bootstrap (preKubeadmCommands) or by hand over ssh on nodes that existed
# before the agent. Usage: install-agent.sh URL amd64=SHA256 [arm64=SHA256]
#   URL may hold {arch}: it becomes amd64 or arm64. A node whose architecture has no SHA256 is refused.
# Still accepted, for one architecture: install-agent.sh URL SHA256
# The download is refused unless its sha256 matches: a node never runs an unverified binary.
# Air-gapped: point URL at your mirror (one file per architecture); only the URL changes.
# INSTALL_AGENT_DEST: where to install (default /usr/local/bin/inplace-agent, agent-start's default).
set -eu
usage="usage: install-agent.sh URL amd64=SHA256 [arm64=SHA256] (URL may hold {arch})"
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
url="$1"
shift
dest="${INSTALL_AGENT_DEST:-/usr/local/bin/inplace-agent}"

machine="$(uname -m)"
case "$machine" in
x86_64 | amd64) arch=amd64 ;;
aarch64 | arm64) arch=arm64 ;;
*)
	echo "install-agent: this node's architecture is $machine (uname -m); inplace-agent is built for x86_64 (amd64) and aarch64 (arm64) only" >&2
	exit 3
	;;
esac

sum=""
if [ $# -eq 1 ] && [ "${1#*=}" = "$1" ]; then
	sum="$1"
else
	for pair in "$@"; do
		case "$pair" in
		"$arch="*) sum="${pair#*=}" ;;
		amd64=* | arm64=*) ;;
		*) echo "install-agent: $pair: expected ARCH=SHA256 with ARCH amd64 or arm64; $usage" >&2; exit 2 ;;
		esac
	done
	[ -n "$sum" ] || { echo "install-agent: no SHA256 for $arch (this node is $machine): add $arch=<sha256 of the $arch binary>" >&2; exit 3; }
fi
case "$sum" in
*[!0-9a-f]* | "") echo "install-agent: SHA256 must be 64 lower-case hex digits" >&2; exit 2 ;;
esac
[ "$(printf '%s' "$sum" | wc -c)" -eq 64 ] || { echo "install-agent: SHA256 must be 64 lower-case hex digits" >&2; exit 2; }
while :; do
	case "$url" in
	*"{arch}"*) url="${url%%"{arch}"*}$arch${url#*"{arch}"}" ;;
	*) break ;;
	esac
done

tmp="$(mktemp "${dest}.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
case "$url" in
file://*) cp "${url#file://}" "$tmp" ;;
*) curl -fsSL --retry 5 --retry-delay 2 --connect-timeout 10 -o "$tmp" "$url" ;;
esac
echo "$sum  $tmp" | sha256sum -c --status - || { echo "install-agent: sha256 mismatch for $url ($arch)" >&2; exit 1; }
chmod 0755 "$tmp"
mv -f "$tmp" "$dest"
trap - EXIT
echo "install-agent: installed $dest ($arch, from $url)"
