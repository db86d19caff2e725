"""dynamic-draft at TP > 1: the per-slot exchange, and the latch every rank takes together.

Every rank runs the same controller on the same gathered numbers, so the ranks stay in lockstep -- the
same forwards, the same collectives -- as long as no rank acts alone. A rank that faults therefore does
not fall back by itself (its peers would break the loop where it does not, and the collectives would
diverge: a hang). It marks the fault pending and keeps following the protocol, and at the next draft
slot its share of the slot's exchange -- the per-row stats all-gather of the local-vocabulary path, or
a one-flag all-gather before the gathered-logits path -- carries NaN: every rank sees which rank
faulted, in the same slot of the same step, and every rank latches off there and runs that slot and
the rest of the step as stock MTP (with look-ahead the slot's per-rank fault flags travel in its host
copy: every rank learns of the fault when that slot is decided, during the next, and latches there;
the faulted slot's token is a valid id, and verified like any other). A fault after the exchange (the
host copy, the controller) cannot be agreed on any more within the step: at TP > 1 it is raised, the
engine stops loudly and the gateway goes unready -- never a split.
"""
from __future__ import annotations

import logging

import torch

from .local_vocab import check_vocab, combine, sample_top1, shard_stats
from .step_control import STEP_ATTR, _Step

logger = logging.getLogger("radiance")


class TpExchange:
    """The patch's side of the ranks' agreement: faults held pending, the slot's exchange, the latch."""

    @staticmethod
    def _tp() -> tuple[int, int]:
        try:
            from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

            return get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        except Exception:
            return 1, 0

    @staticmethod
    def _records() -> bool:
        """Only TP rank 0 counts: every rank runs the same controller."""
        try:
            from vllm.distributed import get_tensor_model_parallel_rank

            return get_tensor_model_parallel_rank() == 0
        except Exception:
            return True

    def fault(self, reason: str) -> None:
        """A fault on this rank: at TP=1 latch off now; at TP>1 keep it pending until the next draft
        slot's exchange carries it to every rank (see the module doc)."""
        tp, rank = self._tp()
        if tp == 1:
            self.latch_off(reason)
        elif self.fault_pending is None:
            self.fault_pending = reason
            logger.warning("radiance: dynamic-draft fault on TP rank %d (%s); every rank turns it off together "
                           "at the next draft slot", rank, reason)

    def _agreed_latch(self, faulted: list[int], local_reason: str | None) -> None:
        """Every rank, same slot: the gathered exchange said which ranks faulted."""
        _, rank = self._tp()
        mine = self.fault_pending or local_reason
        where = f"step {self.steps_seen}"
        if rank in faulted and mine:
            reason = f"fault on TP rank {rank} at {where}: {mine}"
        else:
            reason = f"TP rank(s) {', '.join(map(str, faulted))} faulted at {where}; turned off on every rank together"
        self.fault_pending = None
        self.latch_off(reason)
        tp, _ = self._tp()
        if rank == 0:  # rank 0 speaks for every rank on the report channel
            from ..report import channel

            for r in range(tp):
                if r == 0:
                    continue
                why = (f"fault on TP rank {r} at {where} (its log has the error); turned off on every rank together"
                       if r in faulted else f"TP rank(s) {', '.join(map(str, faulted))} faulted at {where}; "
                                            "turned off on every rank together")
                channel.update_row(str(r), {"patch": self.name, "feature": self.feature,
                                            "status": "failed-at-runtime", "reason": why})

    def _poison_step(self, runner, scheduler_output, sampling_metadata) -> None:
        """TP > 1, this rank's preparation failed: join the step's first exchange with NaN so that
        every rank latches off there, instead of running stock MTP alone (see the module doc)."""
        if self._tp()[0] == 1 or self.fault_pending is None:
            return
        drafter = runner.drafter
        k = int(scheduler_output.num_spec_tokens_to_schedule)
        b = len(runner.input_batch.req_ids)
        # Exactly the steps the peers control reach an exchange: the same decision as _prepare's.
        if b and self._step_or_reason(runner, sampling_metadata, k) is None:
            setattr(drafter, STEP_ATTR, _Step(None, k, b, False, [], poisoned=True))

    def _fault_after_exchange(self, exc: Exception, tp: int) -> None:
        """A fault past the slot's TP exchange: at TP > 1 the ranks can no longer agree within the
        step, so it is raised (module doc); at TP = 1 the feature latches off here."""
        if tp > 1:
            raise RuntimeError(f"radiance dynamic-draft: fault after the TP exchange, on one rank "
                               f"({type(exc).__name__}: {exc}); stopping rather than splitting the ranks") from exc
        self.latch_off(f"draft slot: {type(exc).__name__}: {exc}")

    def _head_of(self, model):
        """(logits processor, head, shard) when drafts can be taken from vocabulary shards, else None."""
        lp = getattr(model, "logits_processor", None)
        head = getattr(model, "lm_head", None)
        shard = getattr(head, "shard_indices", None)
        ok = (self.local_vocab and lp is not None and shard is not None
              and getattr(lp, "scale", None) == 1.0
              and getattr(lp, "soft_cap", 0.0) is None
              and not getattr(lp, "logits_as_input", True)
              and shard.num_added_elements == 0)
        return (lp, head, shard) if ok else None

    def _top1_collective(self, proposer, hidden_states, step: _Step, defer: bool = False):
        """TP>1: (token, confidence, faulted flags, this rank's fault, faulted ranks) for one draft
        slot. Every rank reaches the same exchange whatever happened locally; a rank with a fault
        (pending, a poisoned step, or raised here before the exchange) sends NaN. ``defer``
        (look-ahead): the per-rank flags stay on the device, to travel with the slot's host copy,
        and a faulted row's token is a valid id (0) for the forward that runs ahead; else the
        faulted ranks are read now, the same list on every rank. With the head readable by shard the
        exchange is the three per-row stats (the token without gathering the rows); otherwise a
        one-flag gather before vLLM's gathered logits."""
        from vllm.distributed import (get_tensor_model_parallel_world_size,
                                      tensor_model_parallel_all_gather)

        model = proposer.model
        tp = get_tensor_model_parallel_world_size()
        b = int(hidden_states.shape[0])
        local_reason = self.fault_pending if (self.fault_pending or step.poisoned) else None
        if step.poisoned and local_reason is None:
            local_reason = "step preparation failed"
        head = self._head_of(model)
        if head is None:
            flag = hidden_states.new_zeros((1, 1), dtype=torch.float32)
            if local_reason:
                flag.fill_(float("nan"))
            bad = torch.isnan(tensor_model_parallel_all_gather(flag, dim=-1).view(tp))
            if not defer:
                faulted = [r for r, f in enumerate(bad.tolist()) if f]
                if faulted:
                    return None, None, None, local_reason, faulted
            logits = model.compute_logits(hidden_states)  # stock: gathered rows
            token, conf = sample_top1(logits, 0, logits.shape[-1])
            return token, conf, (bad if defer else None), local_reason, []
        lp, lm_head, shard = head
        if not getattr(proposer, "_radiance_local_vocab_logged", False):
            proposer._radiance_local_vocab_logged = True
            logger.info("radiance: dynamic-draft samples drafts from vocabulary shards (TP=%d, "
                        "3 floats per row exchanged)", tp)
        stats = None
        if not local_reason:
            try:
                check_vocab(lp.org_vocab_size)
                local = lp._apply_head(lm_head, hidden_states, None)
                stats = shard_stats(local.reshape(-1, local.shape[-1]), shard.org_vocab_start_index,
                                    shard.num_org_elements)
            except Exception as exc:
                local_reason = f"draft slot: {type(exc).__name__}: {exc}"
        if stats is None:
            stats = hidden_states.new_full((b, 3), float("nan"), dtype=torch.float32)
        gathered = tensor_model_parallel_all_gather(stats.contiguous(), dim=-1).view(b, tp, 3)
        nan = torch.isnan(gathered[..., 0])
        bad = nan.any(dim=0) if b else gathered.new_zeros(tp, dtype=torch.bool)
        if not defer:
            faulted = [r for r, f in enumerate(bad.tolist()) if f]
            if faulted:
                return None, None, None, local_reason, faulted
            token, conf = combine(gathered)
            return token, conf, None, local_reason, []
        token, conf = combine(torch.nan_to_num(gathered, nan=0.0))
        token = torch.where(nan.any(dim=1), torch.zeros_like(token), token)
        return token, conf, bad, local_reason, []
