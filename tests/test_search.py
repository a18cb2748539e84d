"""The optuna mode's study: seeded by the model, stored in SQLite, resumed without re-timing."""
import optuna

from tuner.search import STUDY_FILE, optuna_search

LABELS = [f"c{i}" for i in range(12)]
TIMES = [5.0, 4.0, 3.5, 0.5, 6.0, 2.0, 7.0, 1.5, 8.0, 3.0, 9.0, 2.5]
PREDICTED = [1.0, 2.0, 3.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0]


def test_study_is_seeded_with_the_model_best_and_finds_the_fastest(tmp_path):
    calls = []
    measured = optuna_search(LABELS, PREDICTED, lambda i: calls.append(i) or TIMES[i], "s", tmp_path, trials=30)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / STUDY_FILE}")
    first = [t.params["candidate"] for t in study.trials[:3]]
    assert first == ["c0", "c1", "c2"]  # the model's top three, enqueued
    assert len(calls) == len(set(calls))  # a candidate is never timed twice
    assert all(measured[i] == TIMES[i] for i in measured)
    assert min(measured, key=measured.get) == 3


def test_study_resumes_and_only_runs_the_missing_trials(tmp_path):
    first_calls, second_calls = [], []
    optuna_search(LABELS, PREDICTED, lambda i: first_calls.append(i) or TIMES[i], "resume", tmp_path, trials=5)
    again = optuna_search(LABELS, PREDICTED, lambda i: second_calls.append(i) or TIMES[i], "resume", tmp_path,
                          trials=8)
    study = optuna.load_study(study_name="resume", storage=f"sqlite:///{tmp_path / STUDY_FILE}")
    assert len(study.trials) == 8
    assert not set(first_calls) & set(second_calls)  # what the first run timed is read back, not re-timed
    assert set(first_calls) <= set(again)
    unchanged = optuna_search(LABELS, PREDICTED, lambda i: 1 / 0, "resume", tmp_path, trials=8)
    assert unchanged == again
