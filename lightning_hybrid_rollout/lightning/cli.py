"""The ``lhr`` console script: a LightningCLI for hybrid-rollout RL, plus ``simulate``, ``plan`` and ``report``.

Usage::

    lhr fit --config examples/quickstart_cpu.yaml
    lhr validate --config examples/quickstart_cpu.yaml
    lhr simulate --preset verl_32_devices [--json] [--plot DIR]
    lhr plan --from-run RUN_DIR --devices 32 [--json] [--plot DIR]
    lhr report RUN_DIR
    lhr settings [SECTION ...]

``fit``/``validate`` are Lightning's own subcommands: the model, the data module, the strategy and the
``HybridRolloutCallback`` are all configurable by ``class_path`` in one YAML file.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from typing_extensions import override

if TYPE_CHECKING:
    from lightning.pytorch.cli import LightningCLI

_SIM_COMMANDS = ("simulate", "plan")


def cli_main(args: Sequence[str], run: bool = True) -> LightningCLI:
    """Build (and by default run) the ``lhr`` LightningCLI on ``args``.

    Args:
        args: Command-line arguments (``["fit", "--config", "x.yaml"]``; without a subcommand when ``run=False``).
        run: Run the subcommand; ``False`` only parses and instantiates (used to validate a config).
    """
    from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

    import lightning_hybrid_rollout.lightning  # noqa: F401  (registers the hybrid strategies)
    from lightning_hybrid_rollout.lightning.data import RolloutDataModule
    from lightning_hybrid_rollout.lightning.expected_warnings import lightning_warnings_hidden
    from lightning_hybrid_rollout.lightning.module import GRPOModule
    from lightning_hybrid_rollout.lightning.progress import add_default_progress_bar

    class HybridRolloutCLI(LightningCLI):
        """LightningCLI with the GRPO module, the rollout-fed data module and the hybrid progress bar as defaults."""

        @override
        def before_instantiate_classes(self) -> None:
            if self.subcommand == "validate":  # a fit's metrics and config are not overwritten by its validation
                trainer = self.config["validate"]["trainer"]
                trainer["logger"] = validate_beside_the_fit(trainer.get("logger"))

        def instantiate_trainer(self, **kwargs: Any) -> Any:
            cfg = self._get(self.config_init, "trainer", default={})
            kwargs.setdefault(
                "callbacks", add_default_progress_bar(cfg.get("callbacks"), cfg.get("enable_progress_bar"))
            )
            return super().instantiate_trainer(**kwargs)

    class RedactedSaveConfigCallback(SaveConfigCallback):
        """Lightning's ``config.yaml`` writer with secrets masked (:mod:`lightning_hybrid_rollout.redaction`)."""

        @override
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if self.already_saved:
                return
            import os

            import yaml

            from lightning_hybrid_rollout.redaction import collect_secrets, redact

            log_dir = trainer.log_dir  # broadcasts the directory
            if trainer.is_global_zero and log_dir is not None:
                config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
                collect_secrets(config)
                os.makedirs(log_dir, exist_ok=True)
                with open(os.path.join(log_dir, self.config_filename), "w") as f:
                    yaml.safe_dump(redact(config), f, sort_keys=False)
                self.save_config(trainer, pl_module, stage)
            self.already_saved = trainer.strategy.broadcast(True)

    with lightning_warnings_hidden():  # the run's Trainer.fit raises them (the first one before any callback hook)
        return HybridRolloutCLI(
            model_class=GRPOModule,
            datamodule_class=RolloutDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=list(args),
            save_config_callback=RedactedSaveConfigCallback,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            run=run,
        )


def validate_beside_the_fit(logger: Any) -> Any:
    """``lhr validate``'s logger config: a logger with a fixed ``version`` (the examples' CSVLogger, ``version: ""``)
    writes to ``<version>-validate`` beside it (``validate/`` for ``""``), so validating a fit's checkpoint with the
    fit's config does not replace its ``metrics.csv``, ``hparams.yaml`` and ``config.yaml``; other loggers are
    unchanged.

    Args:
        logger: The config's ``trainer.logger``: a ``class_path``/``init_args`` entry, a list of them, or a bool.

    Example::

        >>> from jsonargparse import Namespace
        >>> csv = Namespace(class_path="CSVLogger", init_args=Namespace(save_dir="runs/q", version=""))
        >>> validate_beside_the_fit([csv])[0].init_args.version
        'validate'
    """
    for entry in logger if isinstance(logger, list) else [logger]:
        init = getattr(entry, "init_args", None)
        version = getattr(init, "version", None)
        if version is not None:
            init.version = f"{version}-validate" if str(version) else "validate"
    return logger


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``lhr`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from lightning_hybrid_rollout.redaction import install_log_redaction

    install_log_redaction()
    if args and args[0] in _SIM_COMMANDS:
        from lightning_hybrid_rollout.sim import cli as sim_cli

        main_fn = {"simulate": sim_cli.simulate_main, "plan": sim_cli.plan_main}[args[0]]
        raise SystemExit(main_fn(args[1:]))
    if args and args[0] == "report":
        from lightning_hybrid_rollout.analysis.report import report_main

        raise SystemExit(report_main(args[1:]))
    if args and args[0] == "settings":
        raise SystemExit(settings_main(args[1:]))
    if args and args[0] == "prepare-model":
        from lightning_hybrid_rollout.models.prepare_model_cli import prepare_model_main

        raise SystemExit(prepare_model_main(args[1:]))
    from lightning_hybrid_rollout.config import ConfigError
    from lightning_hybrid_rollout.errors import HybridRolloutError
    from lightning_hybrid_rollout.lightning.config_check import config_paths, precheck_config_file

    try:
        for path in config_paths(args):
            precheck_config_file(path)
        if argv is None:  # the arguments are passed explicitly: LightningCLI warns if sys.argv holds them too
            sys.argv = sys.argv[:1]
        cli_main(args)
    except ConfigError as err:
        print(f"lhr: invalid configuration: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except HybridRolloutError as err:
        if not isinstance(err, ValueError):  # a failure while running keeps its traceback
            raise
        print(f"lhr: {err}", file=sys.stderr)  # bad input found at setup (data set, tools, environment, template)
        raise SystemExit(2) from None
    finally:
        close_process_group()


def _sections() -> dict[str, type]:
    from lightning_hybrid_rollout.agentic.config import AgenticConfig
    from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig, TinyModelConfig
    from lightning_hybrid_rollout.rewards.config import RewardConfig
    from lightning_hybrid_rollout.sources.config import DatasetConfig
    from lightning_hybrid_rollout.training.off_policy import OffPolicyCorrection

    classes = (
        RolloutConfig,
        AsyncTrainingConfig,
        DatasetConfig,
        RewardConfig,
        AgenticConfig,
        TinyModelConfig,
        OffPolicyCorrection,
    )
    return {cls.SECTION: cls for cls in classes}


def settings_main(args: Sequence[str]) -> int:
    """``lhr settings [SECTION ...]``: each section's keys, defaults, accepted values and meaning (all sections when
    none is named); an unknown name is one line with the known ones."""
    from lightning_hybrid_rollout.config.settings_table import settings_table
    from lightning_hybrid_rollout.did_you_mean import did_you_mean

    sections = _sections()
    names = list(args) or list(sections)
    unknown = [n for n in names if n not in sections]
    if unknown:
        print(
            f"lhr settings: no section {unknown[0]!r}.{did_you_mean(unknown[0], list(sections))} "
            f"Sections: {', '.join(sections)}.",
            file=sys.stderr,
        )
        return 2
    for name in names:
        sys.stdout.write(f"## {name}\n\n{settings_table(sections[name])}\n\n")
    return 0


def close_process_group() -> None:
    """Destroy the default process group, if any, before the interpreter exits.

    Lightning leaves it alive after ``fit``; gloo's threads then sometimes abort the process at exit ("terminate
    called without an active exception", exit code -6) after a successful multi-rank CPU run.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
