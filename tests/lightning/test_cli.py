"""The ``lhr`` CLI's configuration errors, the example YAML files, and the hybrid-rollout progress bar (fast: no fit
of a real run, no Ray, no vLLM).

Each bad config is ``examples/quickstart_cpu.yaml`` with ONE mistake, run through ``lhr fit --config``: it must exit
with code 2 and ONE short message naming the full key path, the value seen and the fix (never jsonargparse's usage
text or union-type dump). ``cli_main`` is replaced by a stub that fails the test, so a mistake the pre-check misses
can never start a run.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, RichProgressBar, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger

from lightning_hybrid_rollout.lightning import cli
from lightning_hybrid_rollout.lightning.config_check import precheck_config_file
from lightning_hybrid_rollout.lightning.progress import HybridRolloutProgressBar, add_default_progress_bar

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
QUICKSTART = ROOT / "examples" / "quickstart_cpu.yaml"
CB = "trainer.callbacks[0].init_args"
MAX_MESSAGE_CHARS = 700  # one line; an unknown-key message lists its section's keys (rollout has 31)

Mutation = Callable[[dict[str, Any]], None]


def _callback(config: dict[str, Any]) -> dict[str, Any]:
    return config["trainer"]["callbacks"][0]["init_args"]


def _set(path: str, value: Any) -> Mutation:
    """Set ``path`` (``cb.`` = the HybridRolloutCallback's init_args) to ``value``."""

    def mutate(config: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = _callback(config) if key == "cb" else node[key]
        node[last] = value

    return mutate


def _rename(path: str, new_key: str) -> Mutation:
    """Rename the key at ``path`` to ``new_key`` (a typo), keeping its value."""

    def mutate(config: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = _callback(config) if key == "cb" else node[key]
        node[new_key] = node.pop(last)

    return mutate


def _both(*mutations: Mutation) -> Mutation:
    def mutate(config: dict[str, Any]) -> None:
        for m in mutations:
            m(config)

    return mutate


# (id, mutation, substrings the message must contain: the full key path, the value seen, the fix)
BAD_CONFIGS: list[tuple[str, Mutation, list[str]]] = [
    (
        "deactivate_ratio_above_1",
        _set("cb.async_training.dynamic_schedule_deactivate_ratio", 1.5),
        [f"{CB}.async_training.dynamic_schedule_deactivate_ratio", "got 1.5", "(0, 1]", "such as 0.3"],
    ),
    (
        "deactivate_ratio_0",
        _set("cb.async_training.dynamic_schedule_deactivate_ratio", 0),
        [f"{CB}.async_training.dynamic_schedule_deactivate_ratio", "got 0.", "(0, 1]", "such as 0.3"],
    ),
    (
        "policy_typo",
        _set("cb.async_training.dynamic_schedule_policy", "defualt"),
        [f"{CB}.async_training.dynamic_schedule_policy", "'defualt'", "Did you mean 'default'?", "static_fully_async"],
    ),
    (
        "async_training_key_typo",
        _rename("cb.async_training.staleness_threshold", "staleness_treshold"),
        [f"{CB}.async_training has no key 'staleness_treshold'", "Did you mean 'staleness_threshold'?"],
    ),
    (
        "rollout_key_typo",
        _rename("cb.rollout.response_length", "respons_length"),
        [f"{CB}.rollout has no key 'respons_length'", "Did you mean 'response_length'?"],
    ),
    (
        "callback_argument_typo",
        _rename("cb.task", "taks"),
        [f"{CB}.taks is not an argument of HybridRolloutCallback", "Did you mean 'task'?"],
    ),
    (
        "tiny_model_key_typo",
        _rename("cb.build_model.format_warmup_steps", "format_warmup_step"),
        [f"{CB}.build_model has no key 'format_warmup_step'", "Did you mean 'format_warmup_steps'?"],
    ),
    (
        "negative_format_warmup_steps",
        _set("cb.build_model.format_warmup_steps", -1),
        [f"{CB}.build_model.format_warmup_steps", "got -1", "Use 0 to disable it"],
    ),
    (
        "negative_trigger_parameter_sync_step",
        _set("cb.async_training.trigger_parameter_sync_step", -2),
        [f"{CB}.async_training.trigger_parameter_sync_step", "got -2", ">= 1", "Sync weights every N"],
    ),
    (
        "negative_staleness_threshold",
        _set("cb.async_training.staleness_threshold", -1),
        [f"{CB}.async_training.staleness_threshold", "got -1", ">= 0", "such as 0.1"],
    ),
    (
        "mini_batch_size_not_a_multiple_of_n",
        _set("cb.async_training.mini_batch_size", 250),
        [f"{CB}.async_training.mini_batch_size", "multiple of rollout.n=8", "got 250", "use e.g. 248"],
    ),
    (
        "only_hybrid_with_standalone_replicas",
        _set("cb.async_training.only_hybrid", True),
        [f"{CB}.rollout.standalone_replicas", "only_hybrid is true", "got 1", "set standalone_replicas: 0"],
    ),
    (
        "no_replicas",
        _both(_set("cb.rollout.standalone_replicas", 0), _set("cb.rollout.hybrid_replicas", 0)),
        [f"{CB}.rollout.standalone_replicas + rollout.hybrid_replicas", "got 0 + 0", "add at least one replica"],
    ),
    (
        "unscheduled_hybrid_replicas",
        _set("cb.async_training.use_dynamic_resource_scheduling", False),
        [f"{CB}.rollout.hybrid_replicas", "use_dynamic_resource_scheduling is false", "static_fully_async"],
    ),
    (
        "unknown_task",
        _set("cb.task", "arithmatic"),
        [f"{CB}.task", "'arithmatic'", "Did you mean 'arithmetic'?"],
    ),
    (
        "strategy_typo",
        _set("trainer.strategy", "hybrid_fsdp"),
        ["trainer.strategy", "'hybrid_fsdp'", "Did you mean 'hybrid_fsdp2'?"],
    ),
    (
        "n_not_a_number",
        _set("cb.rollout.n", "eight"),
        [f"{CB}.rollout.n", "'eight'", "an integer >= 1", "e.g. 8"],
    ),
    (
        "empty_model_path",
        _set("cb.rollout.model_path", ""),
        [f"{CB}.rollout.model_path", "got ''", "build_model: true"],
    ),
    (
        "dtype_typo",
        _set("cb.rollout.dtype", "bf16"),
        [f"{CB}.rollout.dtype", "'bf16'", "Did you mean 'bfloat16'?"],
    ),
    (
        "build_model_not_a_bool",
        _set("cb.build_model", "maybe"),
        [f"{CB}.build_model", "'maybe'", "`build_model: true`"],
    ),
    (
        "max_steps_not_a_number",
        _set("trainer.max_steps", "abc"),
        ["trainer.max_steps", "'abc'", "an integer", "`max_steps: -1`"],
    ),
    (
        "trainer_key_typo",
        _rename("trainer.max_steps", "max_step"),
        ["trainer.max_step is not an argument of Trainer", "Did you mean 'max_steps'?"],
    ),
    (
        "precision_typo",
        _set("trainer.precision", "bf16-mixd"),
        ["trainer.precision", "'bf16-mixd'", "Did you mean 'bf16-mixed'?"],
    ),
    (
        "callback_class_path_typo",
        lambda c: c["trainer"]["callbacks"][0].__setitem__(
            "class_path", "lightning_hybrid_rollout.HybridRolloutCalback"
        ),
        [
            "trainer.callbacks[0].class_path",
            "'HybridRolloutCalback'",
            "'lightning_hybrid_rollout.HybridRolloutCallback'",
        ],
    ),
    (
        "logger_module_typo",
        _set("trainer.logger.class_path", "lightning.pytorch.logger.CSVLogger"),
        ["trainer.logger[0].class_path", "has no 'logger'", "Did you mean 'lightning.pytorch.loggers.CSVLogger'?"],
    ),
    (
        "model_lr_not_a_number",
        _set("model.init_args.lr", "fast"),
        ["model.init_args.lr", "'fast'", "a number", "`lr: 0.0003`"],
    ),
    (
        "model_argument_unknown",
        _rename("model.init_args.lr", "learning_rate"),
        ["model.init_args.learning_rate is not an argument of GRPOModule", "Valid arguments:", " lr,"],
    ),
    (
        "top_level_key_typo",
        _rename("seed_everything", "seed_everythin"),
        ["seed_everythin is not a top-level key", "Did you mean 'seed_everything'?"],
    ),
    (
        "optimizer_section",
        _set("optimizer", {"class_path": "torch.optim.AdamW"}),
        ["optimizer is not a top-level key", "configured by the model", "model.init_args.lr"],
    ),
]


@pytest.fixture
def quickstart() -> dict[str, Any]:
    return yaml.safe_load(QUICKSTART.read_text())


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``cli_main`` fail the test: a bad config must be stopped by the pre-check, before LightningCLI."""

    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"the pre-check let a bad config through to LightningCLI: {args}")

    monkeypatch.setattr(cli, "cli_main", fail)


def _lhr_fit(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Any, str]:
    with pytest.raises(SystemExit) as exc:
        cli.main(["fit", "--config", str(path)])
    return exc.value.code, capsys.readouterr().err


def _write(tmp_path: Path, config: dict[str, Any], name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.usefixtures("no_run")
@pytest.mark.parametrize(("mutate", "expected"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_one_mistake_gives_one_short_message_naming_key_value_and_fix(
    mutate: Mutation,
    expected: list[str],
    quickstart: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = copy.deepcopy(quickstart)
    mutate(config)
    code, err = _lhr_fit(_write(tmp_path, config), capsys)

    assert code == 2
    message = err.strip()
    assert message.startswith("lhr: invalid configuration: "), message
    assert "\n" not in message, f"expected ONE message:\n{message}"
    assert len(message) < MAX_MESSAGE_CHARS, f"{len(message)} chars:\n{message}"
    for noise in ("usage:", "Subtypes", "Union", "Given value", "Traceback"):
        assert noise not in message, message
    for part in expected:
        assert part in message, f"{part!r} missing from:\n{message}"


@pytest.mark.usefixtures("no_run")
def test_several_mistakes_are_reported_together(
    quickstart: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _set("cb.async_training.dynamic_schedule_deactivate_ratio", 1.5)(quickstart)
    _set("trainer.strategy", "hybrid_fsdp")(quickstart)
    code, err = _lhr_fit(_write(tmp_path, quickstart), capsys)

    assert code == 2
    assert "2 invalid config values:" in err
    assert f"  - {CB}.async_training.dynamic_schedule_deactivate_ratio" in err
    assert "  - trainer.strategy 'hybrid_fsdp'" in err
    assert len(err) < 2 * MAX_MESSAGE_CHARS


@pytest.mark.usefixtures("no_run")
def test_missing_config_file_and_invalid_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _lhr_fit(tmp_path / "nope.yaml", capsys)
    assert code == 2 and "no such file" in err

    broken = tmp_path / "broken.yaml"
    broken.write_text("trainer:\n  max_steps: [1\n")
    code, err = _lhr_fit(broken, capsys)
    assert code == 2 and "is not valid YAML" in err


def test_a_file_given_before_the_subcommand_is_checked_under_its_subcommand(quickstart: dict[str, Any]) -> None:
    """``lhr --config x.yaml fit`` reads ``fit: {trainer: ...}``: key paths then start with ``fit.``."""
    from lightning_hybrid_rollout.lightning.config_check import check_config

    assert check_config({"fit": quickstart}) == []
    _set("cb.rollout.n", 0)(quickstart)
    [problem] = check_config({"fit": quickstart})
    assert problem.startswith(f"fit.{CB}.rollout.n must be >= 1, got 0.")


def test_the_quickstart_itself_passes_and_reaches_lightning_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(cli, "cli_main", lambda args, run=True: calls.append(list(args)))
    cli.main(["fit", "--config", str(QUICKSTART)])
    assert calls == [["fit", "--config", str(QUICKSTART)]]
    assert "invalid configuration" not in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------------------
# The example files
# --------------------------------------------------------------------------------------------------------------


def test_the_documented_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {
        "quickstart_cpu.yaml",
        "quickstart_cpu_static.yaml",
        "quickstart_cpu_wandb.yaml",
        "gpu_multinode.yaml",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_passes_the_precheck(path: Path) -> None:
    config = yaml.safe_load(path.read_text())
    [(i, args)] = [
        (i, c["init_args"])
        for i, c in enumerate(config["trainer"]["callbacks"])
        if c["class_path"].endswith("HybridRolloutCallback")
    ]
    rollout_path = args["rollout"]["model_path"]
    if args.get("build_model") or Path(rollout_path).exists():
        precheck_config_file(path)
        return
    # A cluster example names a model directory this machine does not have: that is its only problem.
    from lightning_hybrid_rollout.lightning.config_check import check_config

    [problem] = check_config(config)
    assert problem.startswith(f"trainer.callbacks[{i}].init_args.rollout.model_path {rollout_path!r} does not exist")


# --------------------------------------------------------------------------------------------------------------
# The one model path (checked before anything starts)
# --------------------------------------------------------------------------------------------------------------

MODEL_PATH_CASES: list[tuple[str, Mutation, list[str]]] = [
    (
        "module_and_rollout_paths_differ",
        _both(
            _set("cb.rollout.model_path", "/nonexistent/model/dir"),
            _set("model.init_args.model_path", "runs/quickstart/model"),
        ),
        ["model.init_args.model_path 'runs/quickstart/model'", f"{CB}.rollout.model_path", "different models"],
    ),
    (
        "missing_dir_without_build_model",
        _both(_set("cb.build_model", False), _set("cb.rollout.model_path", "/nonexistent/model/dir")),
        [f"{CB}.rollout.model_path '/nonexistent/model/dir' does not exist", "build_model: true"],
    ),
    (
        "build_outside_the_run_dir",
        _set("cb.rollout.model_path", "/nonexistent/model/dir"),
        [f"{CB}.rollout.model_path '/nonexistent/model/dir' is outside the run's directory", "empty directory"],
    ),
]


@pytest.mark.parametrize(("case", "mutate", "expected"), MODEL_PATH_CASES, ids=[c[0] for c in MODEL_PATH_CASES])
def test_a_bad_model_path_is_one_line_before_anything_starts_or_is_written(
    case: str,
    mutate: Mutation,
    expected: list[str],
    quickstart: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_run: None,
    ray_started_by_test: Callable[[], bool],
) -> None:
    monkeypatch.chdir(tmp_path)
    mutate(quickstart)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(quickstart))
    code, err = _lhr_fit(path, capsys)
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    for fragment in expected:
        assert fragment in lines[0], (fragment, lines[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # nothing written
    assert not Path("/nonexistent").exists()
    assert not ray_started_by_test()


def test_a_directory_without_config_json_is_refused(tmp_path: Path) -> None:
    from lightning_hybrid_rollout.models.model_path import model_path_problems

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(b"x")
    [problem] = model_path_problems(str(tmp_path / "model"), None, build_model=False, run_dir=tmp_path)
    assert "has no config.json" in problem
    # build_model: an empty directory the user made is fine anywhere; a non-empty one outside the run dir is not
    (tmp_path / "empty").mkdir()
    assert model_path_problems(str(tmp_path / "empty"), None, build_model=True, run_dir=tmp_path / "run") == []
    [problem] = model_path_problems(str(tmp_path / "model"), None, build_model=True, run_dir=tmp_path / "run")
    assert "outside the run's directory" in problem
    # the same directory spelled twice is one model
    assert model_path_problems("runs/x/model", "./runs/x/model/", build_model=True, run_dir="runs/x") == []


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_parses_with_lightning_cli(path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """jsonargparse accepts every example (parse only: a GPU example cannot build its Trainer here)."""
    from lightning.pytorch.cli import LightningCLI

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["lhr"])
    monkeypatch.setattr(LightningCLI, "instantiate_classes", lambda self: None)
    config = cli.cli_main(["--config", str(path)], run=False).config
    expected = yaml.safe_load(path.read_text())

    assert config.trainer.strategy == expected["trainer"]["strategy"]
    assert config.trainer.max_steps == expected["trainer"]["max_steps"]
    hybrid = [c for c in config.trainer.callbacks if c.class_path.endswith("HybridRolloutCallback")]
    assert len(hybrid) == 1
    want = next(c for c in expected["trainer"]["callbacks"] if c["class_path"].endswith("HybridRolloutCallback"))
    assert hybrid[0].init_args.rollout.model_path == want["init_args"]["rollout"]["model_path"]
    policy = want["init_args"]["async_training"]["dynamic_schedule_policy"]
    assert hybrid[0].init_args.async_training.dynamic_schedule_policy == policy


CPU_EXAMPLES = [p for p in EXAMPLES if yaml.safe_load(p.read_text())["trainer"].get("accelerator") == "cpu"]


@pytest.mark.parametrize("path", CPU_EXAMPLES, ids=[p.stem for p in CPU_EXAMPLES])
def test_cpu_example_instantiates_without_starting_anything(
    path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ray_started_by_test: Callable[[], bool]
) -> None:
    """``run=False`` builds the Trainer, module, data module and callback; Ray, the replicas and the tiny model
    only come up in the callback's ``setup``."""
    from lightning_hybrid_rollout import HybridRolloutCallback

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["lhr"])
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    expected = yaml.safe_load(path.read_text())
    lightning_cli = cli.cli_main(["--config", str(path)], run=False)

    callbacks = [c for c in lightning_cli.trainer.callbacks if isinstance(c, HybridRolloutCallback)]
    assert len(callbacks) == 1
    callback = callbacks[0]
    assert callback.runtime is None and callback.controller is None
    assert not ray_started_by_test()
    assert list(tmp_path.iterdir()) == [], "instantiation wrote files (the model is only built in setup)"
    assert type(lightning_cli.trainer.strategy).__name__ == "HybridSingleDeviceStrategy"
    policy = expected["trainer"]["callbacks"][0]["init_args"]["async_training"]["dynamic_schedule_policy"]
    assert callback.run.async_training.dynamic_schedule_policy == policy
    logger_classes = {type(lg).__name__ for lg in lightning_cli.trainer.loggers}
    assert "CSVLogger" in logger_classes
    assert ("WandbLogger" in logger_classes) == ("wandb" in path.stem)


# --------------------------------------------------------------------------------------------------------------
# HybridRolloutProgressBar
# --------------------------------------------------------------------------------------------------------------


class _LogsLikeAHybridRun(LightningModule):
    """A BoringModel that logs the keys the GRPO module and the callback log."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        step = self.trainer.global_step + 1
        self.log("train/reward_mean", 0.25 * step, on_step=True, on_epoch=False, batch_size=1)
        self.log("dynamic_resource/mq_size", 10.0 + step, on_step=True, on_epoch=False, prog_bar=True, batch_size=1)
        self.log("dynamic_resource/hybrid_active", 1.0, on_step=True, on_epoch=False, prog_bar=True, batch_size=1)
        self.log("train/loss_bar", 0.5, on_step=True, on_epoch=False, prog_bar=True, batch_size=1)
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=2)


class _Record(Callback):
    def __init__(self, bar: HybridRolloutProgressBar) -> None:
        self.bar = bar
        self.seen: list[dict[str, Any]] = []

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.seen.append(dict(self.bar.get_metrics(trainer, pl_module)))


def test_progress_bar_shows_step_reward_queue_and_hybrid_with_short_labels(tmp_path: Path) -> None:
    bar = HybridRolloutProgressBar()
    record = _Record(bar)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        log_every_n_steps=1,
        logger=CSVLogger(tmp_path, name="", version=""),  # a logger, so Lightning's default adds `v_num`
        callbacks=[bar, record],
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(_LogsLikeAHybridRun())

    assert trainer.progress_bar_callback is bar
    assert record.seen[-1] == {"step": "2", "reward": 0.5, "queue": "12", "hybrid": "1", "train/loss_bar": 0.5}
    assert record.seen[0]["step"] == "1" and record.seen[0]["queue"] == "11"
    final = bar.get_metrics(trainer, trainer.lightning_module)
    assert list(final)[:4] == ["step", "reward", "queue", "hybrid"]
    assert "v_num" not in final
    assert not {"train/reward_mean", "dynamic_resource/mq_size", "dynamic_resource/hybrid_active"} & set(final)


def test_progress_bar_leaves_out_metrics_not_logged_yet_and_takes_custom_labels() -> None:
    class _FakeTrainer:
        global_step = 3
        callback_metrics = {"train/kl": torch.tensor(0.125)}
        progress_bar_metrics: dict[str, float] = {}
        loggers: list[Any] = []
        logger = None

    bar = HybridRolloutProgressBar(short_names={"train/kl": "kl"})
    assert bar.get_metrics(_FakeTrainer(), None) == {"step": "3", "kl": 0.125}  # type: ignore[arg-type]
    assert HybridRolloutProgressBar().get_metrics(_FakeTrainer(), None) == {"step": "3"}  # type: ignore[arg-type]


def test_add_default_progress_bar_respects_a_users_bar_and_enable_progress_bar() -> None:
    other = Callback()
    with_default = add_default_progress_bar([other])
    assert with_default[0] is other and isinstance(with_default[1], HybridRolloutProgressBar)
    assert isinstance(add_default_progress_bar(None)[0], HybridRolloutProgressBar)
    assert isinstance(add_default_progress_bar(other, enable_progress_bar=None)[-1], HybridRolloutProgressBar)
    users_bar = TQDMProgressBar()
    assert add_default_progress_bar([other, users_bar]) == [other, users_bar]
    assert add_default_progress_bar([other], enable_progress_bar=False) == [other]
    assert issubclass(HybridRolloutProgressBar, RichProgressBar)


def test_lhr_validate_scores_greedy_answers_on_held_out_prompts(tmp_path: Path, quickstart: dict[str, Any]) -> None:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "model", hidden=64, layers=1, seed=0)
    config = copy.deepcopy(quickstart)
    config["trainer"]["default_root_dir"] = str(tmp_path / "run")
    config["trainer"]["logger"] = False
    config["trainer"]["callbacks"] = []
    config["model"]["init_args"]["model_path"] = str(model_dir)
    config["data"]["init_args"]["val_prompts"] = 8
    path = _write(tmp_path, config, "validate.yaml")
    cli_obj = cli.cli_main(["validate", "--config", str(path)])
    reward = float(cli_obj.trainer.callback_metrics["val/reward"])
    assert 0.0 <= reward <= 1.0


def test_lhr_validate_with_the_fits_own_config_keeps_the_fits_metrics_and_config(
    tmp_path: Path, quickstart: dict[str, Any]
) -> None:
    """The README's ``lhr validate --config <the fit's config> --ckpt_path ...``: the example's CSVLogger has a fixed
    version (``""``), so validation wrote its one row over the fit's ``metrics.csv`` (and its config). It now logs
    to ``validate/`` beside them."""
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "model", hidden=64, layers=1, seed=0)
    run = tmp_path / "run"
    config = copy.deepcopy(quickstart)
    config["trainer"]["default_root_dir"] = str(run)
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(run)
    assert config["trainer"]["logger"]["init_args"]["version"] == ""  # as the example has it
    config["trainer"]["callbacks"] = []
    config["model"]["init_args"]["model_path"] = str(model_dir)
    config["data"]["init_args"]["val_prompts"] = 8
    run.mkdir()
    fit_files = {"metrics.csv": "step,train/reward_mean\n0,0.1\n1,0.2\n", "config.yaml": "# the fit's\n"}
    for name, text in fit_files.items():
        (run / name).write_text(text)
    cli_obj = cli.cli_main(["validate", "--config", str(_write(tmp_path, config, "validate.yaml"))])
    assert {name: (run / name).read_text() for name in fit_files} == fit_files
    assert cli_obj.trainer.log_dir == str(run / "validate")
    assert "val/reward" in (run / "validate" / "metrics.csv").read_text()
