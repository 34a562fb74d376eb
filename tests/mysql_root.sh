#!/usr/bin/env bash
# Build the Debian unstable root that tests/dbs.py starts throw-away Oracle MySQL servers from
# (ASSETQ_TEST_MYSQL=mysql97). Debian unstable's mysql-server-core (9.7) needs a newer C library
# than the Debian 12 machines this project runs on, so its mysqld runs from a root of its own,
# made with debootstrap from the Debian mirror this machine's apt already uses: nothing is
# downloaded from anywhere else.
#
#   tests/mysql_root.sh          build the root when it is missing (about 3 minutes, ~565 MB)
#   tests/mysql_root.sh --path   print where the root is (built or not)
#
# The root lives outside the repository, in ${XDG_CACHE_HOME:-$HOME/.cache}/assetq/mysql-9.7-root
# (or $ASSETQ_MYSQL_ROOT). It is built in a temporary directory beside it and renamed at the
# end, so a half-built root is never used. Needs root (debootstrap) and the debootstrap package.
set -euo pipefail

root=${ASSETQ_MYSQL_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/assetq/mysql-9.7-root}
if [ "${1:-}" = --path ]; then
    printf '%s\n' "$root"
    exit 0
fi
say() { printf 'mysql_root.sh: %s\n' "$*"; }

if [ -x "$root/usr/sbin/mysqld" ]; then
    say "$root is there"
    exit 0
fi

# The mirror: the first Debian archive (not -security) this machine's apt lists, in the
# deb822 (.sources) or the one-line format.
mirror=$(
    shopt -s nullglob
    for file in /etc/apt/sources.list.d/*.sources; do sed -n 's/^URIs:[[:space:]]*//p' "$file"; done
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -e "$file" ] || continue
        sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' "$file"
    done
)
mirror=$(printf '%s\n' "$mirror" | tr ' ' '\n' | grep -E '/debian/?$' | head -n 1 || true)
if [ -z "$mirror" ]; then
    say "found no Debian mirror in /etc/apt/sources.list{,.d}"
    exit 1
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then as_root=(sudo -n); fi
if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

mkdir -p "$(dirname "$root")"
building=$(mktemp -d "$root.building.XXXXXX")
trap '"${as_root[@]}" rm -rf "$building" "$building.log"' EXIT
say "debootstrap unstable from $mirror into $building"
start=$SECONDS
"${as_root[@]}" debootstrap --variant=minbase --include=mysql-server-core \
    unstable "$building" "$mirror" >"$building.log" 2>&1 || {
    tail -n 20 "$building.log"
    exit 1
}
rm -f "$building.log"
# The apt caches are only needed to build the root.
"${as_root[@]}" rm -rf "$building/var/cache/apt/archives/"*.deb
"${as_root[@]}" chmod 755 "$building"
mv "$building" "$root"
trap - EXIT
say "$root built in $((SECONDS - start))s: $("$root/usr/sbin/mysqld" --version 2>/dev/null ||
    "${as_root[@]}" chroot "$root" /usr/sbin/mysqld --version)"
