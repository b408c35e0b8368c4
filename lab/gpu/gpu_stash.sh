#!/usr/bin/env bash
# First command of every GPU call that carries a part of the vLLM bundle (lab/gpu/gpu_bundle.sh): move
# .xfer/* out of the repository into $SCRATCH/aepo-parts (default /tmp), where the next call's carry
# cannot replace or delete them, then print the boot id (the same id in two calls: the same machine,
# parts still there) and the parts held so far. Prints three or four short lines.
set -euo pipefail
cd "$(dirname "$0")/../.."
parts="${SCRATCH:-/tmp}/aepo-parts"
mkdir -p "$parts"
if compgen -G ".xfer/*" >/dev/null; then
    mv -f .xfer/* "$parts/"
fi
echo "boot $(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo unknown)"
echo "parts in $parts: $(cd "$parts" && ls | tr '\n' ' ')($(du -sh "$parts" | cut -f1))"
