#!/bin/sh
# Makes the carried OpenSSH (Debian 12 binaries and their libraries) usable on the device machine,
# for benchmarks/bench_remote.py only: /usr/sbin/sshd and ssh/ssh-keygen on PATH as wrappers.
L=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$L/wrap" /run/sshd && chmod 755 /run/sshd
id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd
for b in ssh ssh-keygen; do printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/bin/%s-real "$@"\n' "$L" "$L" "$b" > "$L/wrap/$b"; chmod +x "$L/wrap/$b"; done
[ -e /usr/sbin/sshd ] || { printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/bin/sshd-real "$@"\n' "$L" "$L" > /usr/sbin/sshd; chmod +x /usr/sbin/sshd; }
