"""The ``optuna`` tuning mode: an Optuna study per fingerprint, stored in SQLite under the cache directory.

The study's single parameter is the candidate (a categorical over the candidates' labels); the objective is
the measured time. It is seeded with the model's best candidates through ``enqueue_trial`` and is
resumable: a later call with a larger budget continues the same study and never re-times a candidate.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Sequence

STUDY_FILE = "optuna.sqlite3"


def optuna_search(labels: Sequence[str], predicted: Sequence[float], measure_one: Callable[[int], float],
                  study_name: str, storage_dir: Path, trials: int = 24, seed_top: int = 3,
                  seed: int = 0) -> dict[int, float]:
    """Run (or continue) the study until it holds ``trials`` trials; return {candidate index: ms}.

    Example (a fake benchmark: candidate 2 is fastest):
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> r = optuna_search(["a", "b", "c"], [1.0, 2.0, 3.0], lambda i: [3.0, 2.0, 1.0][i], "s", d, trials=3)
        >>> min(r, key=r.get)
        2
    """
    import optuna
    optuna.logging.set_verbosity(logging.WARNING)
    storage_dir.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name=study_name, storage=f"sqlite:///{storage_dir / STUDY_FILE}",
                                direction="minimize", load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=seed))
    index = {label: i for i, label in enumerate(labels)}
    measured: dict[int, float] = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        label = t.params.get("candidate")
        if label in index:
            measured[index[label]] = float(t.value)
    if not study.trials:
        for i in sorted(range(len(labels)), key=lambda i: predicted[i])[:seed_top]:
            study.enqueue_trial({"candidate": labels[i]})

    def objective(trial) -> float:
        i = index[trial.suggest_categorical("candidate", list(labels))]
        if i not in measured:  # the sampler may propose a candidate again: its time is known
            measured[i] = float(measure_one(i))
        return measured[i]

    done = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    if trials > done:
        study.optimize(objective, n_trials=trials - done)
    return measured
