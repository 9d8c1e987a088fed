#!/bin/sh
# Run OpenSSH where the machine has none (the GPU device image), for benchmarks/bench_remote.py only.
#
#   sh benchmarks/sshlab_setup.sh DIR
#
# DIR holds bin/sshd-real, bin/ssh-real, bin/ssh-keygen-real and lib/ (their shared libraries, glibc
# excepted), copied from a machine that has OpenSSH, e.g. Debian 12:
#   mkdir -p DIR/bin DIR/lib; cp /usr/sbin/sshd DIR/bin/sshd-real; cp /usr/bin/ssh DIR/bin/ssh-real
#   cp /usr/bin/ssh-keygen DIR/bin/ssh-keygen-real
#   for l in $(ldd /usr/sbin/sshd /usr/bin/ssh /usr/bin/ssh-keygen | awk '/=>/{print $3}' | sort -u \
#              | grep -v 'libc.so.6\|libresolv'); do cp -L $l DIR/lib/; done
# This script writes wrappers that set LD_LIBRARY_PATH: DIR/wrap/ssh, DIR/wrap/ssh-keygen (put DIR/wrap
# first on PATH) and /usr/sbin/sshd when there is none; it creates sshd's privilege-separation user and
# /run/sshd. Meant for a throwaway machine.
set -eu
L=$(cd "${1:?usage: sshlab_setup.sh DIR}" && pwd)
mkdir -p "$L/wrap" /run/sshd && chmod 755 /run/sshd
id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd
for b in ssh ssh-keygen; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/bin/%s-real "$@"\n' "$L" "$L" "$b" > "$L/wrap/$b"
  chmod +x "$L/wrap/$b"
done
if [ ! -e /usr/sbin/sshd ]; then
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/bin/sshd-real "$@"\n' "$L" "$L" > /usr/sbin/sshd
  chmod +x /usr/sbin/sshd
fi
