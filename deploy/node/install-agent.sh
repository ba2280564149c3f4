#!/bin/sh
# Installs the inplace-agent binary on a node (bootstrap preKubeadmCommands, or by hand over ssh
# for nodes that existed before the agent). Usage: install-agent.sh URL SHA256
# The download is refused unless its sha256 matches: a node never runs an unverified binary.
# Air-gapped: point URL at your mirror; only the URL changes.
# INSTALL_AGENT_DEST: where to install (default /usr/local/bin/inplace-agent, agent-start's default).
set -eu
url="${1:?usage: install-agent.sh URL SHA256}"
sum="${2:?usage: install-agent.sh URL SHA256}"
dest="${INSTALL_AGENT_DEST:-/usr/local/bin/inplace-agent}"

case "$sum" in
*[!0-9a-f]* | "") echo "install-agent: SHA256 must be 64 lower-case hex digits" >&2; exit 2 ;;
esac
[ "$(printf '%s' "$sum" | wc -c)" -eq 64 ] || { echo "install-agent: SHA256 must be 64 lower-case hex digits" >&2; exit 2; }

tmp="$(mktemp "${dest}.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
case "$url" in
file://*) cp "${url#file://}" "$tmp" ;;
*) curl -fsSL --retry 5 --retry-delay 2 --connect-timeout 10 -o "$tmp" "$url" ;;
esac
echo "$sum  $tmp" | sha256sum -c --status - || { echo "install-agent: sha256 mismatch for $url" >&2; exit 1; }
chmod 0755 "$tmp"
mv -f "$tmp" "$dest"
trap - EXIT
echo "install-agent: installed $dest"
