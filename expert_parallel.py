"""Expert parallelism (train.ep): the routed experts of every MoE layer split over `ep` ranks, the
tokens moved to them and back by all-to-all; every other weight sharded by FSDP2 over all ranks.

Layout. The W ranks form a mesh (W/ep, ep): rank = d·ep + e. The ep ranks of a row (consecutive
ranks: one node when ep <= GPUs per node) hold all E experts between them, E/ep each: rank e holds
experts [e·E/ep, (e+1)·E/ep). Each expert weight is a DTensor of its global shape [E, ...] placed
Shard(0) over the "ep" dim, and FSDP2 shards every rank's [E/ep, ...] further over the "dp" dim (the
W/ep ranks that hold the same experts) along dim 1 (F or D): dim 0 has only E/ep rows, which may be
fewer than those ranks, and a second split of it would interleave the rows in checkpoints.
Checkpoints (torch.distributed.checkpoint) see global tensors: they load at any ep and any world
size, and --export writes them whole.

One MoE layer on one rank (T tokens, k picks each, E experts, El = E/ep of them here):
  1. route as usual: ids [T, k] of global experts, combine weights [T, k]
  2. sort the T·k (token, pick) rows by expert: rank r's experts are then one contiguous run
  3. all-to-all of the counts [E] (how many rows this rank sends to each expert), then of the rows
     themselves with uneven splits (the counts summed per rank): a rank receives, from every source
     rank in turn, that rank's rows for its El experts, sorted by expert
  4. moe.dispatch of the received rows by local expert (aligned groups), the grouped GEMMs under
     the run's recipe (moe.GroupedExperts, unchanged), the rows taken back out of the buffer
  5. the reverse all-to-all, the rows put back in (token, pick) order; the combine as usual.
Both all-to-alls are differentiable: the backward of one is the other with the splits swapped. The
received rows of one expert come in (source rank, token) order, which is the order one process
would see for the ranks' batches concatenated, so the expert GEMMs see the same rows in the same
groups. Loads for the balancing bias are counted per global expert on the sending rank and summed
over all ranks by moe.update_bias, as without expert parallelism.

Gradients: FSDP2 divides by the size of the mesh it reduces over; the expert weights are reduced
over W/ep ranks only, but their gradient sums the tokens of all W ranks, so their divide factor is
set to W. The gradient norm sums the squares of every rank's local shards (the shards of both
meshes partition the model) and reduces them once.

Under torch.compile the dispatcher, experts included, runs eagerly (the rest of the block compiles).

ep = 1 touches none of this: no mesh, no DTensor experts, moe.MoE.routed runs as in one process.
"""
import math

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard

import moe


def check(ep: int, world: int, mcfg, mode: str):
    """Errors that say how to fix an ep that cannot be laid out."""
    if ep < 1:
        raise SystemExit(f'train.ep={ep} must be >= 1 (1: no expert parallelism)')
    if ep == 1:
        return
    if mcfg.moe is None:
        raise SystemExit(f'train.ep={ep} splits routed experts, but the model has none; use an MoE preset or ep=1')
    E = mcfg.moe.n_routed_experts
    if E % ep:
        raise SystemExit(f'train.ep={ep} does not divide the {E} routed experts; use a divisor of {E}')
    if world % ep:
        raise SystemExit(f'train.ep={ep} does not divide the world size {world}; start a multiple of '
                         f'{ep} processes or pick an ep that divides {world}')
    if mode != 'fsdp':
        raise SystemExit(f'train.ep={ep} runs under train.parallel=fsdp, not {mode}')


class _AllToAll(torch.autograd.Function):
    """all_to_all_single along dim 0 with uneven splits; its backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, dy):
        out_splits, in_splits = ctx.splits
        return _all_to_all(dy, in_splits, out_splits, ctx.group), None, None, None


def _all_to_all(x, out_splits, in_splits, group):
    out = x.new_empty(sum(out_splits), *x.shape[1:])
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class Dispatcher:
    """moe.MoE.routed for a layer whose experts are split over the ranks of `group` (module docstring)."""

    def __init__(self, layer, group):
        self.layer, self.group, self.ep = layer, group, dist.get_world_size(group)

    # eager under torch.compile: the splits are data (a host sync), and a graph would be traced per split
    @torch.compiler.disable
    def __call__(self, x_TD, idx_TK):
        layer, ep = self.layer, self.ep
        E, (T, K), D = layer.cfg.n_routed_experts, idx_TK.shape, x_TD.shape[1]
        El = E // ep
        dev = x_TD.device.type  # send what the GEMMs read: the autocast dtype
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x_TD.dtype
        flat = idx_TK.flatten()
        counts_E = torch.bincount(flat, minlength=E)
        order = flat.argsort(stable=True)  # (token, pick) rows sorted by expert, hence by rank
        recv_E = torch.empty_like(counts_E)  # [source rank, local expert]: rows coming here
        dist.all_to_all_single(recv_E, counts_E, group=self.group)
        send = counts_E.view(ep, El).sum(1).tolist()  # a host sync: the splits live on the host
        recv = recv_E.view(ep, El).sum(1).tolist()
        x_ND = _AllToAll.apply(x_TD.to(dtype)[order // K], recv, send, self.group)
        # local expert of every received row: runs of recv_E[s, e] rows, source by source
        local_N = torch.arange(El, device=flat.device).repeat(ep).repeat_interleave(recv_E)
        rows_N1, offs_E, _, M = moe.dispatch(local_N[:, None], El, layer.experts.block())
        rows = rows_N1.flatten()
        y_MD = layer.experts(x_ND.new_zeros(M, D).index_copy(0, rows, x_ND), offs_E)
        y_ND = _AllToAll.apply(y_MD[rows], send, recv, self.group)
        return y_ND.new_zeros(T * K, D).index_copy(0, order, y_ND).view(T, K, D), counts_E


def shard_experts(model, ep: int, device_type: str, mp_policy):
    """Split every MoE layer's routed experts over ep ranks and shard them with FSDP2 over the rest
    (call before fully_shard of the blocks). Returns the (dp, ep) mesh."""
    world = dist.get_world_size()
    mesh = init_device_mesh(device_type, (world // ep, ep), mesh_dim_names=('dp', 'ep'))
    ep_mesh, e = mesh['ep'], mesh['ep'].get_local_rank()
    for _, layer in moe.moe_layers(model):
        experts, El = layer.experts, layer.cfg.n_routed_experts // ep
        for name, p in list(experts.named_parameters(recurse=False)):
            local = p.detach()[e * El:(e + 1) * El]  # meta or initialized: this rank's experts
            dt = DTensor.from_local(local, ep_mesh, [Shard(0)], run_check=False, shape=p.shape, stride=p.stride())
            setattr(experts, name, torch.nn.Parameter(dt, requires_grad=p.requires_grad))
        fully_shard(experts, mesh=mesh['dp'], mp_policy=mp_policy, shard_placement_fn=lambda p: Shard(1))
        experts.set_gradient_divide_factor(world)  # their gradients sum the tokens of all ranks
        if device_type == 'cpu' and world > ep:  # gloo has no pre-multiplied sum: a sum, then the division
            experts.set_force_sum_reduction_for_comms(True)
        layer.dispatcher = Dispatcher(layer, ep_mesh.get_group())
    return mesh


@torch.no_grad()
def clip_grad_norm_(params, max_norm: float):
    """torch.nn.utils.clip_grad_norm_ for parameters on two meshes (experts and the rest): the
    squares of every rank's local gradient shards, summed over all ranks."""
    grads = [p.grad for p in params if p.grad is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    total = torch.stack(torch._foreach_norm(local, dtype=torch.float32)).square().sum()
    dist.all_reduce(total)
    norm = total.sqrt()
    if math.isfinite(max_norm):
        torch._foreach_mul_(local, (max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm
