#!/bin/sh
# mmdebstrap --customize-hook for tools/image.sh: removes the files of every package that
# is neither in the minbase set (listed by the essential hook in $1/tmp/minbase-packages)
# nor in DRPC_IMAGE_KEEP (space-separated: the packages owning the libraries the binaries
# load, whose closure ldd lists in full, and the data set). What is left of such a package
# is its dpkg record: the image is rebuilt, never upgraded in place.
set -eu
root="$1"
dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Package}\n' | grep -vxF -f "$root/tmp/minbase-packages" |
  while read -r pkg; do
    case " $DRPC_IMAGE_KEEP " in *" $pkg "*) continue ;; esac
    dpkg-query --admindir="$root/var/lib/dpkg" -L "$pkg" | while read -r f; do
      # Files and links to files only: /bin, /lib64, ... are links to directories (merged /usr).
      if [ ! -d "$root$f" ] && { [ -L "$root$f" ] || [ -f "$root$f" ]; }; then rm -f "$root$f"; fi
    done
  done
