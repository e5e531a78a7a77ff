"""The trained networks: the actor (a causal LM, optionally LoRA, with its frozen reference) and the critic
(a value model with its own trunk), as verl builds them.

The critic starts from the same checkpoint as the actor but shares no trainable weight with it, so a
value-loss gradient can never move the policy. With LoRA the two trunks share the frozen base weights
(one copy in memory) and each trains its own adapter; the reference policy is the actor with its
adapter switched off. Full fine-tuning gives the critic and the reference their own copies.

Memory (the [positions × vocabulary] float32 tensors dominate a long rollout's update): the
vocabulary projection runs only on generated positions (inserted ``<information>`` tokens are never
scored), in chunks of ``logit_chunk_tokens`` positions under activation checkpointing, so one chunk's
logits exist at a time in the forward and the backward; the trunk can checkpoint its layers too.

Devices: the networks live on ``training_device`` (a CUDA GPU when torch sees one). Batches are built
on the CPU (their row bookkeeping never waits on the device); the networks' outputs stay on the model's
device, and so does everything per token after them (losses, advantages, statistics): a copy back to
the host would make every micro-batch wait for the device to finish it. On the CPU it is the same code.

``save_policy`` writes a plain Hugging Face checkpoint of the served architecture (LoRA merged) that
the policy service can load; ``trainable_state`` holds what only the trainer needs to resume. Both are
CPU copies, so a checkpoint written on a GPU resumes anywhere.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ragr1.model_paths import model_with_weights
from ragr1.services.trainer import fsdp, ppo_math
from ragr1.services.trainer.config import DEVICES, ModelSettings
from ragr1.services.trainer.data import TokenSequence
from ragr1.services.trainer.precision import Mastered, MasterWeights

log = logging.getLogger(__name__)

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def init_torch(settings: ModelSettings) -> None:
    """The process-wide torch state every training run starts from: its seed and its CPU threads."""
    torch.manual_seed(settings.seed)
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)


def training_device(name: str) -> torch.device:
    """``auto``: the current CUDA GPU when torch sees one, else the CPU. ``cuda`` without a GPU is an
    error, not a silent fall-back: on a GPU node it means a CPU-only torch or a pod without its GPU."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if name not in DEVICES:
        raise ValueError(f"device must be one of {list(DEVICES)}, got {name!r}")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device=cuda, but torch {torch.__version__} sees no CUDA GPU (a CPU-only torch build, or no GPU "
            "visible to this process: check CUDA_VISIBLE_DEVICES and the pod's nvidia.com/gpu); "
            "use --device cpu or --device auto"
        )
    return torch.device("cuda", torch.cuda.current_device())


@dataclasses.dataclass
class Batch:
    """Right-padded prompt+response ids, with the response positions gathered out."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    positions: torch.Tensor  # [B, R]: index of the logit that predicts response token j
    response_ids: torch.Tensor  # [B, R]
    mask: torch.Tensor  # [B, R] float: loss mask, 0 on padding
    temperature: torch.Tensor  # [B]: the temperature each row was sampled at

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device) -> Batch:
        """The batch on ``device`` (itself when it is there already)."""
        if self.input_ids.device == device:
            return self
        return Batch(*(getattr(self, f.name).to(device) for f in dataclasses.fields(self)))

    def select(self, index: Sequence[int]) -> Batch:
        """The rows ``index``, without the input padding none of them uses (the trunk's cost is
        rows × width; the response columns cost nothing, only generated positions are scored)."""
        rows = torch.as_tensor(list(index), dtype=torch.long)
        width = int(self.attention_mask[rows].sum(dim=1).max())
        return Batch(
            self.input_ids[rows, :width],
            self.attention_mask[rows, :width],
            self.positions[rows],
            self.response_ids[rows],
            self.mask[rows],
            self.temperature[rows],
        )


def collate(
    sequences: Sequence[TokenSequence], pad_id: int, temperatures: Sequence[float] | None = None
) -> Batch:
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in sequences]
    width, rwidth = max(lengths), max(len(s.response_ids) for s in sequences)
    batch = len(sequences)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    positions = torch.zeros((batch, rwidth), dtype=torch.long)
    response = torch.full((batch, rwidth), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, rwidth), dtype=torch.float32)
    for i, s in enumerate(sequences):
        if not s.prompt_ids:
            raise ValueError("a sequence needs at least one prompt token to predict its response from")
        ids = s.prompt_ids + s.response_ids
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        r = len(s.response_ids)
        positions[i, :r] = torch.arange(len(s.prompt_ids) - 1, len(ids) - 1)
        response[i, :r] = torch.tensor(s.response_ids)
        mask[i, :r] = torch.tensor(s.loss_mask, dtype=torch.float32)
    temps = torch.ones(batch) if temperatures is None else torch.tensor(list(temperatures), dtype=torch.float32)
    return Batch(input_ids, attention, positions, response, mask, temps)


def micro_batches(batch: Batch, rows: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """``rows`` in micro-batches of at most ``max_rows`` rows and ``max_tokens`` padded tokens (0 = no
    token cap; a row longer than the cap goes alone), longest rows first so that rows of similar
    length share their padding."""
    lengths = batch.attention_mask.sum(dim=1)
    ordered = sorted(rows, key=lambda r: -int(lengths[r]))
    out: list[list[int]] = []
    for row in ordered:
        current = out[-1] if out else None
        # Sorted longest first: the micro-batch's width is its first row's length.
        if (
            current is not None
            and len(current) < max_rows
            and (max_tokens <= 0 or (len(current) + 1) * int(lengths[current[0]]) <= max_tokens)
        ):
            current.append(row)
        else:
            out.append([row])
    return out


def _generated(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, response column) of every generated token: the only positions ever scored."""
    rows, cols = torch.nonzero(batch.mask > 0, as_tuple=True)
    return rows, cols


def _scatter(values: torch.Tensor, batch: Batch, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` on ``values``' device, ``values`` at (rows, cols) and 0 elsewhere."""
    out = torch.zeros(batch.mask.shape, dtype=values.dtype, device=values.device)
    return out.index_put((rows, cols), values)


def _hidden_at(trunk: Any, batch: Batch, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The trunk's last hidden state at the positions that predict the generated tokens: ``[N, H]``."""
    # No attention mask: rows are right-padded, so under the causal mask a real token never sees a pad, and
    # only real positions are read. Given a mask, transformers reads it on the host to see whether it pads
    # (a wait on the device every pass) and attends through it instead of the fused causal kernel.
    hidden = trunk(input_ids=batch.input_ids, use_cache=False)[0]
    return hidden[rows, batch.positions[rows, cols]]


def native_bf16(device: torch.device, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether ``device`` multiplies bfloat16 in hardware: a CUDA GPU that supports it, or an x86 CPU with
    AVX-512 BF16 or AMX. Elsewhere (AVX2 CPUs, such as many AMD EPYC hosts) torch emulates bfloat16 matmuls
    and autocast makes training many times slower than float32 (docs/services/trainer.md, measured)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:  # not Linux: no way to tell, and float32 is never the slow choice
        return False
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def autocast(bf16: bool, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def _enable_gradient_checkpointing(network: Any) -> None:
    # Non-reentrant: works with frozen embeddings (LoRA) and keeps autocast in the recomputation.
    network.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class Outputs(NamedTuple):
    """A named tuple, not a dataclass: FSDP finds the tensors a root module returns (to gather its
    weights again for their backward) in the containers torch's pytree knows."""

    logprobs: torch.Tensor  # [B, R], 0 where the mask is 0
    entropy: torch.Tensor  # [B, R], 0 where the mask is 0


class PolicyModel(Mastered, nn.Module):
    """The actor: log-probs and entropy of generated tokens at each row's sampling temperature."""

    def __init__(
        self,
        model_dir: Path,
        *,
        lora_rank: int = 0,
        lora_alpha: int = 32,
        with_reference: bool = False,
        bf16: bool | None = None,
        gradient_checkpointing: bool = False,
        logit_chunk_tokens: int = 1024,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        # fp32 master weights (AdamW's updates of LoRA adapters or every weight), bf16 compute by autocast.
        base: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        base.to(self.device)
        # None: bfloat16 autocast where the hardware computes it natively (native_bf16 says where).
        self.bf16 = native_bf16(self.device) if bf16 is None else bf16
        if bf16 is None:
            log.info("bf16 autocast %s on %s (%s)", "on" if self.bf16 else "off", self.device,
                     "native bfloat16" if self.bf16 else "no native bfloat16: float32 is faster here")
        self.lora = lora_rank > 0
        self.lora_rank, self.lora_alpha = lora_rank, lora_alpha
        # Set by hold_weights_in_compute_dtype: the trained weights in bfloat16 with float32 masters.
        self.masters: MasterWeights | None = None
        self.logit_chunk_tokens = logit_chunk_tokens
        self.gradient_checkpointing = gradient_checkpointing
        self.reference: nn.Module | None = None
        if with_reference and not self.lora:
            # Full fine-tuning needs its own frozen copy; LoRA gets the reference by disabling adapters.
            self.reference = copy.deepcopy(base).eval().requires_grad_(False)
        if gradient_checkpointing:
            _enable_gradient_checkpointing(base)
        if self.lora:
            from peft import get_peft_model

            self.lm: nn.Module = get_peft_model(base, self.lora_config())
        else:
            self.lm = base

    def lora_config(self) -> Any:
        from peft import LoraConfig

        return LoraConfig(
            r=self.lora_rank, lora_alpha=self.lora_alpha, lora_dropout=0.0, bias="none", target_modules=LORA_TARGETS
        )

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def base(self) -> Any:
        """The causal LM (LoRA layers injected when LoRA is on)."""
        return self.lm.get_base_model() if self.lora else self.lm  # type: ignore[operator]

    def actor_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.lm.parameters() if p.requires_grad]

    def hold_weights_in_compute_dtype(self) -> bool:
        """With bf16 and every weight trained, on one device: the weights in bfloat16 from now on, the optimiser's
        float32 masters in ``masters`` (``precision``), the reference in bfloat16, and no autocast. LoRA keeps
        float32 adapters under autocast (its frozen weights are shared with the critic's trunk); a sharded
        network keeps FSDP's own. Call it once the critic has copied its trunk; returns whether it did."""
        params = self.actor_parameters()
        if not self.bf16 or self.lora or self.masters is not None or any(fsdp.is_sharded(p) for p in params):
            return False
        self.masters = MasterWeights(params)
        if self.reference is not None:
            with torch.no_grad():
                # Parameters only: the rotary embeddings' frequencies (a buffer) stay float32, as the actor's do.
                for p in self.reference.parameters():
                    p.data = p.data.to(torch.bfloat16)
        return True

    def trained_parameters(self) -> list[nn.Parameter]:
        return self.actor_parameters()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return autocast(self.bf16 and self.masters is None, self.device)

    def _run(self, network: Any, batch: Batch) -> Outputs:
        """Log-probs and entropy on the model's device, whichever device ``batch`` is on."""
        # The generated positions are found where the batch was built (the CPU): torch.nonzero on a GPU
        # tensor waits for the device to learn the count.
        rows, cols = (t.to(self.device) for t in _generated(batch))
        on_device = batch.to(self.device)
        head = network.get_output_embeddings()
        targets = on_device.response_ids[rows, cols]
        temperature = on_device.temperature[rows]
        logprobs, entropy = [], []
        with self.autocast():
            hidden = _hidden_at(network.get_decoder(), on_device, rows, cols)

            def score(h: torch.Tensor, t: torch.Tensor, temp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return ppo_math.tempered_logprobs_and_entropy(head(h), t, temp)

            for start in range(0, hidden.shape[0], self.logit_chunk_tokens):
                part = slice(start, start + self.logit_chunk_tokens)
                args = (hidden[part], targets[part], temperature[part])
                # Checkpointed: the backward recomputes this chunk's logits instead of keeping them.
                lp, ent = checkpoint(score, *args, use_reentrant=False) if torch.is_grad_enabled() else score(*args)
                logprobs.append(lp)
                entropy.append(ent)
        if not logprobs:
            empty = torch.zeros(batch.mask.shape, device=self.device)
            return Outputs(empty, empty.clone())
        return Outputs(
            _scatter(torch.cat(logprobs), on_device, rows, cols), _scatter(torch.cat(entropy), on_device, rows, cols)
        )

    def forward(self, batch: Batch, reference: bool = False) -> Outputs:
        """The actor's outputs, or the reference policy's. Both go through ``forward`` so that FSDP's
        hooks on this root module gather its parameters for either (``fsdp``)."""
        if not reference:
            return self._run(self.base(), batch)
        if self.reference is not None:
            return self._run(self.reference, batch)
        if not self.lora:
            raise ValueError("no reference policy: build the model with with_reference=True or LoRA")
        with self.lm.disable_adapter():  # type: ignore[operator]
            return self._run(self.base(), batch)

    @torch.no_grad()
    def reference_logprobs(self, batch: Batch) -> torch.Tensor:
        return self(batch, reference=True).logprobs

    def shard(self) -> None:
        """FSDP: each decoder layer (the reference's too) a unit, this module the root."""
        layers = list(self.base().get_decoder().layers)
        if self.reference is not None:
            layers += list(self.reference.get_decoder().layers)  # type: ignore[operator]
        fsdp.shard(self, layers)

    # -- saving ---------------------------------------------------------------------------------
    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """The served architecture's weights, LoRA adapters folded in.

        Computed out of place: peft's merge/unmerge would round the frozen base weights (which the
        critic's trunk and the reference share) a little differently each time."""
        if not self.lora:
            masters = _masters(self)
            return {k: _cpu_copy(masters.get(id(v), v)) for k, v in self.lm.state_dict(keep_vars=True).items()}
        from peft.tuners.lora import LoraLayer

        deltas = {}
        for name, module in self.base().named_modules():
            if isinstance(module, LoraLayer):
                # Defined on LoraLayer's concrete subclasses (Linear here), not on the base class.
                delta = module.get_delta_weight("default")  # type: ignore[attr-defined]
                deltas[f"{name}.weight"] = delta.detach()
        state = {}
        for key, value in self.base().state_dict().items():
            if "lora_" in key:
                continue
            key = key.replace(".base_layer.", ".")
            state[key] = _cpu_copy(value + deltas[key] if key in deltas else value)
        return state

    def save_policy(self, directory: Path) -> None:
        """A Hugging Face checkpoint (config, safetensors, tokenizer) the policy service loads."""
        base = self.base()
        state = self.merged_state_dict()
        if getattr(base.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        if self.lora or self.masters is not None:
            # Saved through a plain model of the same config: the adapted one would save peft's layers, and one in
            # bfloat16 would write bfloat16 as the checkpoint's dtype (its weights are the float32 masters).
            model_with_weights(type(base), base.config, state).save_pretrained(directory, safe_serialization=True)
        else:
            base.save_pretrained(directory, state_dict=state, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """What training changes: the adapters (or every weight)."""
        return trainable_state(self)

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        load_trainable_state(self, state)


class ValueModel(Mastered, nn.Module):
    """The critic: a trunk of its own (from the actor's checkpoint) and a scalar value head, evaluated at
    the positions that predict each generated token (verl's critic reads values the same way)."""

    def __init__(self, actor: PolicyModel) -> None:
        super().__init__()
        trunk = actor.base().get_decoder()
        if actor.lora:
            # Share the frozen base weights (one copy in memory), then give the copy its own adapter,
            # reset to the checkpoint (B = 0) whatever the actor's adapter holds now.
            from peft.tuners.lora import LoraLayer

            frozen = {id(p): p for p in trunk.parameters() if not p.requires_grad}
            self.trunk: nn.Module = copy.deepcopy(trunk, memo=frozen)
            for module in self.trunk.modules():
                if isinstance(module, LoraLayer):
                    module.reset_lora_parameters("default", True)
        else:
            self.trunk = copy.deepcopy(trunk).requires_grad_(True)
        if actor.gradient_checkpointing:
            _enable_gradient_checkpointing(self.trunk)
        self.bf16 = actor.bf16
        self.lora = actor.lora
        self.device = actor.device
        self.masters: MasterWeights | None = None
        # Zero-initialised: every value starts at 0 (the return of an unscored trajectory).
        self.value_head = nn.Linear(trunk.config.hidden_size, 1, device=self.device)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def shard(self) -> None:
        fsdp.shard(self, list(self.trunk.layers))  # type: ignore[arg-type]

    def critic_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def hold_weights_in_compute_dtype(self) -> bool:
        """The trunk's weights in bfloat16 with float32 masters, as ``PolicyModel``'s; the value head (one row of
        weights) stays float32 and is stepped as it is."""
        trunk = [p for p in self.trunk.parameters() if p.requires_grad]
        if not self.bf16 or self.lora or self.masters is not None or any(fsdp.is_sharded(p) for p in trunk):
            return False
        self.masters = MasterWeights(trunk)
        return True

    def trained_parameters(self) -> list[nn.Parameter]:
        return self.critic_parameters()

    def float32_trained(self) -> list[nn.Parameter]:
        return [p for p in self.value_head.parameters() if p.requires_grad]

    def forward(self, batch: Batch) -> torch.Tensor:
        """``[B, R]`` values on the model's device, 0 where the mask is 0."""
        rows, cols = (t.to(self.device) for t in _generated(batch))
        on_device = batch.to(self.device)
        with autocast(self.bf16 and self.masters is None, self.device):
            hidden = _hidden_at(self.trunk, on_device, rows, cols)
        values = self.value_head(hidden.float()).squeeze(-1)
        return _scatter(values, on_device, rows, cols)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return trainable_state(self)

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        load_trainable_state(self, state)


def _named_trainable(module: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    for name, param in module.named_parameters():
        if param.requires_grad and not name.startswith("reference."):
            yield name, param


def _cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A plain CPU copy; a sharded (FSDP) tensor is gathered whole first, a collective."""
    return fsdp.full(tensor.detach()).to("cpu", copy=True)


def _masters(module: nn.Module) -> dict[int, nn.Parameter]:
    """Each trained weight's float32 master, by the weight's ``id``, where ``module`` holds them."""
    held: MasterWeights | None = getattr(module, "masters", None)
    return held.master_of() if held is not None else {}


def trainable_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of the trainable weights (their float32 masters where they are held)."""
    masters = _masters(module)
    return {k: _cpu_copy(masters.get(id(v), v)) for k, v in _named_trainable(module)}


def load_trainable_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    params = dict(_named_trainable(module))
    missing = sorted(set(params) - set(state))
    if missing:
        raise ValueError(f"trainer state lacks {len(missing)} parameters, e.g. {missing[:3]}")
    masters = _masters(module)
    with torch.no_grad():
        for name, param in params.items():
            target = masters.get(id(param), param)
            target.copy_(fsdp.distribute_like(state[name], target))
    held: MasterWeights | None = getattr(module, "masters", None)
    if held is not None:
        held.publish()
