#!/usr/bin/env bash
# Multi-node training with torchrun's c10d rendezvous. Run the same command on every node:
#
#   NNODES=4 MASTER_ADDR=node0 scripts/torchrun_multinode.sh configs/moe-7.9b.toml \
#       --quant.recipe=ufp4 --log.out_dir=/shared/runs/moe-7.9b-ufp4
#
# NNODES: number of nodes; MASTER_ADDR: a host every node can reach (it serves the rendezvous on
# MASTER_PORT, default 29500); NPROC_PER_NODE: processes (GPUs) per node, default 8; RDZV_ID: a job
# name that is the same on every node. The nodes need the repository, the data (data.dir) and the run
# directory (log.out_dir) on a filesystem they share: every rank writes its own checkpoint shards
# there. More than one process turns on FSDP2 (train.parallel=auto); --train.parallel=ddp replicates.
# Arguments after the config are train.py's. Started again, the run resumes from its checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${NNODES:?set NNODES to the number of nodes}"
: "${MASTER_ADDR:?set MASTER_ADDR to a host name of one of the nodes, reachable from all of them}"
exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="$NNODES" --nproc_per_node="${NPROC_PER_NODE:-8}" \
    --rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:${MASTER_PORT:-29500}" --rdzv_id="${RDZV_ID:-nanofp4}" \
    train.py "$@"
