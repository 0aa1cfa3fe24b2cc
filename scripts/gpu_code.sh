#!/usr/bin/env bash
# Which GPU code the Makefile builds: `gpu_code.sh flags` prints nvcc's -gencode flags, `gpu_code.sh reason`
# why. For each distinct GPU that nvidia-smi lists (compute capability 8.0 or newer): machine code for it,
# sm_90a on Hopper (wgmma and TMA). Without such a GPU (CI, a login node): machine code for every supported
# architecture plus compute_120 PTX, which GPUs newer than the newest listed here compile when they load it.
set -u
SUPPORTED="8.0 8.6 8.9 9.0 10.0 12.0"
ALSO_BUILDABLE="8.7 10.3 11.0 12.1"  # built when detected (nvcc 13 knows them), not in the all-GPU binary
gencode() {
    local cc=${1/./}
    if [ "$cc" = 90 ]; then echo "-gencode arch=compute_90a,code=sm_90a"; else echo "-gencode arch=compute_$cc,code=sm_$cc"; fi
}
gpus=$( (nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2> /dev/null || true) | sort -u |
        awk -F', ' 'NF == 2 && $2 ~ /^[0-9]+[.][0-9]+$/')
flags="" names=""
while IFS= read -r line; do
    [ -n "$line" ] || continue
    name=${line%, *} cc=${line##*, }
    names+="${names:+; }$name (compute capability $cc)"
    for known in $SUPPORTED $ALSO_BUILDABLE; do
        if [ "$cc" = "$known" ]; then
            g=$(gencode "$cc")
            case " $flags " in *" $g "*) ;; *) flags+="${flags:+ }$g" ;; esac
        fi
    done
done <<< "$gpus"
if [ -n "$flags" ]; then
    reason="detected $names"
else
    for cc in $SUPPORTED; do flags+="${flags:+ }$(gencode "$cc")"; done
    flags+=" -gencode arch=compute_120,code=compute_120"
    if [ -n "$names" ]; then reason="no GPU of compute capability 8.0 or newer among $names: one binary for every supported GPU"
    else reason="no GPU found: one binary for every supported GPU"; fi
fi
case "${1:-}" in
    flags) echo "$flags" ;;
    reason) echo "$reason" ;;
    *) echo "usage: $0 flags|reason" >&2; exit 2 ;;
esac
