"""Optuna's TPE sampler as a pipe for benchmarks/knob_tune.py, run by the interpreter of a venv
that has Optuna (kept out of optlab's own): read "ask" or {"tell": n, "value": v} lines, answer
a trial's number and params, or "ok"."""

import json
import sys

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)
space = json.loads(sys.argv[1])
study = optuna.create_study(
    direction="maximize", sampler=optuna.samplers.TPESampler(seed=int(sys.argv[2]))
)
trials = {}
for line in sys.stdin:
    line = line.strip()
    if line == "ask":
        trial = study.ask()
        params = {name: trial.suggest_categorical(name, values) for name, values in space}
        trials[trial.number] = trial
        print(json.dumps({"number": trial.number, "params": params}), flush=True)
    elif line:
        told = json.loads(line)
        study.tell(trials.pop(told["tell"]), told["value"])
        print("ok", flush=True)
