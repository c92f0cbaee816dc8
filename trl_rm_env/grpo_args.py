"""`RewardModelArguments`: the reward-model and prompt-data section of the GRPO recipe's `TrlParser`."""

from __future__ import annotations

from dataclasses import dataclass, field

from datasets import Dataset

from .data.loaders import load_rank_records
from .data.sources import parse_data_spec
from .heads import parse_attribute_weights
from .sharing import normalize_prefix_sharing


@dataclass
class RewardModelArguments:
    """Which reward model scores GRPO completions, how, and which prompts the policy answers.

    Args:
        reward_model: Hub id or local path of a `*ForSequenceClassification` reward model.
        reward_tokenizer: Tokenizer of the RM (defaults to the RM's own; its chat template renders every sample).
        reward_batch_size: Sequences per RM forward pass.
        reward_max_tokens_per_batch: Token budget per RM forward pass (padding included).
        reward_max_length: Longest sequence the RM reads; longer contexts are left-truncated.
        reward_precision: fp32, bf16 or fp16.
        reward_normalization: none, running or checkpoint.
        reward_clip: Clip (normalized) rewards to [-clip, clip].
        strip_reasoning: Drop `<think>...</think>` from completions before scoring.
        reward_prefix_sharing: Score the completions of each GRPO group against one encoding of their prompt (KV
            cache; exact). `auto` (default): where the RM supports it and it pays; `true`: always; `false`: never.
        reward_engine: What runs the RM here: `auto` (default: vLLM where it is installed and this is one process,
            else transformers), `vllm` or `hf` (see `trl_rm_env.scoring.loading.choose_engine`).
        reward_vllm_gpu_memory_utilization: With vLLM, the share of the device's memory the RM may take (default:
            a KV cache of what scoring needs, the rest is the policy's).
        reward_vllm_tensor_parallel_size: With vLLM, GPUs the RM is split over.
        reward_remote_url: Score on reward-model servers at these URLs instead of loading the RM here;
            `reward_model` is then the model name sent to the server (`trl-rm-env serve`: the path it serves).
        reward_remote_api: The servers' dialect: `pooling` (vLLM `/pooling`, ours), `classify` (vLLM `/classify`)
            or `openrlhf` (`/get_reward`). The API key is read from `TRL_RM_ENV_API_KEY` or `VLLM_API_KEY`, never
            from the command line (it would show in `ps` and in logs).
        reward_name: The reward function's name (TRL logs `rewards/<name>/mean`).
        reward_attribute_weights: For a regression RM: `name=weight` entries (`helpfulness=1 verbosity=-0.2`;
            unnamed attributes weigh 0). Default: the checkpoint's own `attribute_weights`.
        prompt_data: Prompt source: a Hub dataset id (`:split` optional), a local file, or a rank-schema source
            (`sample:train`), whose contexts become the prompts.
        prompt_column: Column holding the prompt (string or messages) for Hub/local prompt datasets.
        build_tiny_model: Build the tiny offline models (`make-tiny`) when the policy path, a folder named `policy`, is
            missing (quickstart). A missing `reward_model` is always an error, never replaced by the untrained tiny RM.
    """

    reward_model: str = field(default="Skywork/Skywork-Reward-V2-Qwen3-0.6B", metadata={"help": "RM id or path."})
    reward_tokenizer: str | None = field(default=None, metadata={"help": "RM tokenizer (default: the RM's)."})
    reward_batch_size: int | None = field(default=None, metadata={"help": "Sequences per RM forward pass."})
    reward_max_tokens_per_batch: int | None = field(default=None, metadata={"help": "Tokens per RM forward pass."})
    reward_max_length: int | None = field(default=None, metadata={"help": "Longest sequence the RM reads."})
    reward_precision: str = field(default="fp32", metadata={"help": "fp32, bf16 or fp16."})
    reward_normalization: str = field(default="none", metadata={"help": "none, running or checkpoint."})
    reward_clip: float | None = field(default=None, metadata={"help": "Clip rewards to [-clip, clip]."})
    strip_reasoning: bool = field(default=False, metadata={"help": "Drop <think>...</think> before scoring."})
    # `str` for the parser (it would parse `bool | str` as a bool); `environment_kwargs` maps it to True/False/"auto".
    reward_prefix_sharing: str = field(
        default="auto",
        metadata={
            "help": "Score each GRPO group's completions against one encoding of their prompt (exact): auto, true "
            "or false.",
            "choices": ["auto", "true", "false"],
        },
    )
    reward_engine: str = field(
        default="auto",
        metadata={"help": "What runs the RM: auto, vllm or hf.", "choices": ["auto", "vllm", "hf"]},
    )
    reward_vllm_gpu_memory_utilization: float | None = field(
        default=None, metadata={"help": "vLLM: share of the device's memory the RM may take (default: what it needs)."}
    )
    reward_vllm_tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM: GPUs the RM is split over."})
    reward_remote_url: list[str] | None = field(
        default=None,
        metadata={"help": "Score on RM servers (trl-rm-env serve, or vLLM --runner pooling) at these URLs."},
    )
    reward_remote_api: str = field(
        default="pooling",
        metadata={
            "help": "Remote RM dialect: pooling, classify or openrlhf.",
            "choices": ["pooling", "classify", "openrlhf"],
        },
    )
    reward_name: str = field(default="reward_model_env", metadata={"help": "Name of the reward function."})
    reward_attribute_weights: list[str] | None = field(
        default=None,
        metadata={"help": "Regression RM: name=weight entries (default: the checkpoint's attribute_weights)."},
    )
    prompt_data: str = field(default="sample:train", metadata={"help": "Prompt dataset source."})
    prompt_column: str = field(default="prompt", metadata={"help": "Prompt column of a prompt dataset."})
    build_tiny_model: bool = field(
        default=False, metadata={"help": "Build the tiny offline models if the policy path is missing."}
    )

    def attribute_weights(self) -> dict[str, float] | None:
        """`reward_attribute_weights` as `{name: weight}` (None when unset).

        Raises:
            ValueError: An entry is not `name=<number>`, or a name appears twice.
        """
        if not self.reward_attribute_weights:
            return None
        return parse_attribute_weights(self.reward_attribute_weights, "reward_attribute_weights")

    def environment_kwargs(self) -> dict:
        """Keyword arguments for `RewardModelEnvironment` (besides the model): this recipe's `reward_*` keys mapped
        onto the environment's own options and its `ScoringOptions`, in this one place."""
        if self.reward_remote_url:
            if self.reward_attribute_weights:
                raise ValueError(
                    "reward_attribute_weights applies to a reward model loaded here; a server returns one score per "
                    "sample: give the weights to the server instead (`trl-rm-env serve --attribute-weights ...`)."
                )
            return dict(
                remote_url=list(self.reward_remote_url),
                remote_api=self.reward_remote_api,
                # OpenRLHF's /get_reward takes text, rendered here with the RM's tokenizer (its path or Hub id); vLLM's
                # dialects get token ids encoded with it (without `reward_tokenizer`, `reward_model`'s when it loads).
                tokenizer=(self.reward_tokenizer or self.reward_model)
                if self.reward_remote_api == "openrlhf"
                else self.reward_tokenizer,
                normalization=self.reward_normalization,
                clip=self.reward_clip,
                strip_reasoning=self.strip_reasoning,
                name=self.reward_name,
            )
        return dict(
            tokenizer=self.reward_tokenizer,
            batch_size=self.reward_batch_size,
            max_tokens_per_batch=self.reward_max_tokens_per_batch,
            max_length=self.reward_max_length,
            precision=self.reward_precision,
            normalization=self.reward_normalization,
            clip=self.reward_clip,
            strip_reasoning=self.strip_reasoning,
            name=self.reward_name,
            prefix_sharing=normalize_prefix_sharing(self.reward_prefix_sharing),
            attribute_weights=self.attribute_weights(),
            engine=self.reward_engine,
            vllm_gpu_memory_utilization=self.reward_vllm_gpu_memory_utilization,
            vllm_tensor_parallel_size=self.reward_vllm_tensor_parallel_size,
        )

    def load_prompts(self) -> Dataset:
        """A dataset with a `prompt` column (messages or text), as `GRPOTrainer` expects."""
        _, source, split = parse_data_spec(self.prompt_data)
        if source.startswith("sample:") or source.endswith((".jsonl", ".json")) and self._is_rank_file(source):
            records, _ = load_rank_records(source, split=split)
            seen, prompts = set(), []
            for record in records:
                key = repr(record["context"])
                if key not in seen:
                    seen.add(key)
                    prompts.append({"prompt": record["context"]})
            return Dataset.from_list(prompts)
        from datasets import load_dataset

        if source.endswith((".jsonl", ".json")):
            dataset = load_dataset("json", data_files=source, split="train")
        else:
            dataset = load_dataset(source, split=split or "train")
        if self.prompt_column not in dataset.column_names:
            raise ValueError(
                f"Prompt dataset {self.prompt_data!r} has no column {self.prompt_column!r} (columns: "
                f"{dataset.column_names}); set --prompt_column."
            )
        if self.prompt_column != "prompt":
            dataset = dataset.rename_column(self.prompt_column, "prompt")
        return dataset

    @staticmethod
    def _is_rank_file(path: str) -> bool:

        with open(path, encoding="utf-8") as f:
            first = f.readline() if path.endswith(".jsonl") else f.read(1 << 16)
        return '"completions"' in first and '"context"' in first
