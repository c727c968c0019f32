#!/usr/bin/env bash
# Prints, one a line, the Debian packages that own the shared libraries BINARY... load
# (their whole ldd closure), libc6 excepted (every Debian base has it); fails naming a
# library that no package owns. What tools/image.sh and deploy/Dockerfile put in the image,
# so a library added to a BUILD file reaches the image by itself.
#   tools/image_packages.sh BINARY...
set -euo pipefail
libs=$(for b in "$@"; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
# dpkg knows a library by the path its package installed, which may be the link's target.
owners=$( (dpkg -S $libs; dpkg -S $(readlink -f $libs)) 2>/dev/null || true)
owned=$(printf '%s\n' "$owners" | sed 's|^.*/||')  # by file name: ldd says /lib/..., dpkg /usr/lib/...
for lib in $libs; do
  # A here-string, not `printf | grep -q`: grep -q exits at its first match, and under
  # pipefail the printf that then writes into the closed pipe (SIGPIPE) failed the check.
  grep -qxF -e "${lib##*/}" -e "$(basename "$(readlink -f "$lib")")" <<<"$owned" || {
    echo "image_packages.sh: no Debian package owns $lib" >&2
    exit 1
  }
done
printf '%s\n' "$owners" | cut -d: -f1 | tr ',' '\n' | sed 's/^ *//' | grep -v '^$' | grep -vx libc6 | sort -u
