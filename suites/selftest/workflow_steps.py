"""One job of a GitHub Actions workflow, its `run:` steps executed here as a runner would, for
the self-tests of the adopter templates (test_template_jobs.py): actionlint checks a
workflow's syntax, not what its shell scripts do.

What a runner does, and this does too: `${{ }}` expressions in env, `if:`, `working-directory`
and `run:`, evaluated against the contexts given (github, vars, inputs, matrix, runner, env);
env layered workflow -> job -> step; each script run by the step's shell - unspecified, GitHub
runs `bash -e {0}`; `shell: bash` (a step's, or `defaults.run.shell`) is `bash --noprofile
--norc -eo pipefail {0}`; `$GITHUB_ENV` / `$GITHUB_PATH` lines applied to the later steps;
`$GITHUB_STEP_SUMMARY` collected; after a failed step only `if: always()` / `failure()` steps
run. What it does not: `uses:` steps (the caller checks out the workspace itself; cache and
artifact steps are listed as not run), containers, services, runner labels.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
from dataclasses import dataclass, field
from typing import Optional

import yaml

_TOKEN = re.compile(r"\s*(?:('(?:[^']|'')*')|(\d+(?:\.\d+)?)|(&&|\|\||==|!=|<=|>=|<|>|!|\(|\)|,)"
                    r"|([A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_*][A-Za-z0-9_-]*)*))")
SHELLS = {None: ["bash", "-e"], "bash": ["bash", "--noprofile", "--norc", "-eo", "pipefail"], "sh": ["sh", "-e"]}
_FUNCTIONS = {"fromJSON": lambda s: json.loads(s), "toJSON": json.dumps,
              "contains": lambda a, b: (b in a) if a is not None else False,
              "startsWith": lambda a, b: str(a or "").lower().startswith(str(b or "").lower()),
              "endsWith": lambda a, b: str(a or "").lower().endswith(str(b or "").lower())}


def _translate(expr: str) -> str:
    """A GitHub expression as a Python one over `_ctx` (context lookups) and `_f` (functions):
    `||` / `&&` return an operand, as Python's or / and do."""
    out, pos = [], 0
    while pos < len(expr.rstrip()):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"expression {expr!r}: cannot read {expr[pos:]!r}")
        pos = m.end()
        s, num, op, name = m.groups()
        if s is not None:
            out.append(repr(s[1:-1].replace("''", "'")))
        elif num is not None:
            out.append(num)
        elif op is not None:
            out.append({"&&": " and ", "||": " or ", "!": " not "}.get(op, f" {op} "))
        elif name in ("true", "false", "null"):
            out.append({"true": "True", "false": "False", "null": "None"}[name])
        elif expr[pos:].lstrip().startswith("(") and "." not in name:
            out.append(f"_f[{name!r}]")
        else:
            out.append(f"_ctx({name!r})")
    return "".join(out)


@dataclass
class StepRun:
    name: str
    outcome: str  # success | failure | skipped | not run (a `uses:` step)
    output: str = ""


@dataclass
class JobRun:
    steps: list[StepRun] = field(default_factory=list)
    summary: str = ""
    env: dict = field(default_factory=dict)  # the environment the last step saw

    @property
    def ok(self) -> bool:
        return all(s.outcome != "failure" for s in self.steps)

    def step(self, prefix: str) -> StepRun:
        return next(s for s in self.steps if s.name.startswith(prefix))

    def text(self) -> str:
        return "\n".join(f"--- {s.name}: {s.outcome}\n{s.output[-4000:]}" for s in self.steps)


class Workflow:
    def __init__(self, path: pathlib.Path):
        self.path = pathlib.Path(path)
        self.doc = yaml.safe_load(self.path.read_text())

    def run_job(self, job: str, *, workspace: pathlib.Path, runner_temp: pathlib.Path, github: dict,
                vars: dict, inputs: Optional[dict] = None, matrix: Optional[dict] = None,
                base_env: Optional[dict] = None, skip: Optional[dict] = None, default_shell: Optional[str] = None,
                timeout: float = 900) -> JobRun:
        """Run `job`'s steps. `github` is the github context (event_name, sha, event, ...);
        `base_env` the runner's own environment; `skip` {step-name prefix: why} leaves steps
        out that cannot run here (a GPU check on a CPU machine): skipping one is the caller's
        statement, printed in the step's output. `default_shell` stands for a `defaults.run.shell`
        an adopter adds to the copied file (e.g. "bash": every step then runs under pipefail)."""
        spec = self.doc["jobs"][job]
        default_shell = (default_shell or ((spec.get("defaults") or {}).get("run") or {}).get("shell")
                         or ((self.doc.get("defaults") or {}).get("run") or {}).get("shell"))
        runner_temp.mkdir(parents=True, exist_ok=True)
        files = {k: runner_temp / f"_{k.lower()}" for k in ("GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY")}
        for f in files.values():
            f.write_text("")
        ctx = {"github": dict(github, job=job, workspace=str(workspace)), "vars": dict(vars),
               "inputs": dict(inputs or {}), "matrix": dict(matrix or {}), "runner": {"temp": str(runner_temp),
                                                                                        "os": "Linux"},
               "env": {}}
        ctx["github"].setdefault("run_attempt", "1")
        env = dict(base_env if base_env is not None else os.environ)
        env.update({"GITHUB_WORKSPACE": str(workspace), "RUNNER_TEMP": str(runner_temp),
                    "GITHUB_SHA": github.get("sha", ""), "GITHUB_EVENT_NAME": github.get("event_name", ""),
                    "GITHUB_JOB": job, "CI": "true", **{k: str(v) for k, v in files.items()}})
        for layer in (self.doc.get("env") or {}, spec.get("env") or {}):
            for k, v in layer.items():
                env[k] = ctx["env"][k] = self._string(v, ctx)
        out, failed = JobRun(), False
        for step in spec["steps"]:
            name = step.get("name") or step.get("uses", "")
            cond = step.get("if")
            status = "failure" if failed else "success"
            if "uses" in step:
                out.steps.append(StepRun(name, "not run", f"uses: {step['uses']} (not run here)"))
                continue
            why = next((w for p, w in (skip or {}).items() if name.startswith(p)), None)
            if why is not None:
                out.steps.append(StepRun(name, "skipped", f"left out by the caller: {why}"))
                continue
            if not self._condition(cond, ctx, status):
                out.steps.append(StepRun(name, "skipped", f"if: {cond}"))
                continue
            step_env = dict(env)
            step_ctx = dict(ctx, env=dict(ctx["env"]))
            for k, v in (step.get("env") or {}).items():
                step_env[k] = step_ctx["env"][k] = self._string(v, step_ctx)
            cwd = pathlib.Path(self._string(step.get("working-directory", str(workspace)), step_ctx))
            script = runner_temp / "_step.sh"
            script.write_text(self._string(step["run"], step_ctx))
            p = subprocess.run(SHELLS[step.get("shell", default_shell)] + [str(script)], cwd=cwd,
                               env=step_env, capture_output=True, text=True, timeout=timeout)
            ok = p.returncode == 0
            out.steps.append(StepRun(name, "success" if ok else "failure",
                                     f"exit {p.returncode}\n{p.stdout}{p.stderr}"))
            failed = failed or not ok
            for line in files["GITHUB_ENV"].read_text().splitlines():
                if "=" in line:
                    k, v = line.split("=", 1)
                    env[k] = ctx["env"][k] = v
            files["GITHUB_ENV"].write_text("")
            for line in files["GITHUB_PATH"].read_text().splitlines():
                env["PATH"] = f"{line}{os.pathsep}{env.get('PATH', '')}"
            files["GITHUB_PATH"].write_text("")
        out.summary = files["GITHUB_STEP_SUMMARY"].read_text()
        out.env = env
        return out

    # ---- expressions --------------------------------------------------------------------------
    def _eval(self, expr: str, ctx: dict, status: str = "success"):
        def lookup(path: str):
            head, *rest = path.split(".")
            if head not in ctx:
                raise ValueError(f"{self.path.name}: unknown context {head!r} in {path!r}")
            v = ctx[head]
            for part in rest:
                v = v.get(part) if isinstance(v, dict) else None
            if head == "vars" and v is None:
                return ""  # an unset repository variable reads as an empty string
            return v
        functions = dict(_FUNCTIONS, always=lambda: True, success=lambda: status == "success",
                         failure=lambda: status == "failure", cancelled=lambda: False)
        return eval(_translate(expr), {"__builtins__": {}}, {"_ctx": lookup, "_f": functions})

    def _string(self, value, ctx: dict) -> str:
        """`value` with each `${{ expr }}` replaced by its value as GitHub writes it."""
        def sub(m):
            v = self._eval(m.group(1), ctx)
            return "" if v is None else ("true" if v is True else "false" if v is False else str(v))
        return re.sub(r"\$\{\{(.*?)\}\}", sub, str(value), flags=re.S)

    def _condition(self, cond, ctx: dict, status: str) -> bool:
        if cond is None:
            return status == "success"
        text = str(cond).strip()
        m = re.fullmatch(r"\$\{\{(.*)\}\}", text, re.S)
        text = m.group(1) if m else text
        if not re.search(r"\b(always|success|failure|cancelled)\(", text):
            text = f"success() && ({text})"
        return bool(self._eval(text, ctx, status))

    def job_condition(self, job: str, *, github: dict, vars: dict, inputs: Optional[dict] = None) -> bool:
        """The job's own `if:` (a fork guard, a variable that switches a job on)."""
        cond = self.doc["jobs"][job].get("if")
        ctx = {"github": github, "vars": vars, "inputs": inputs or {}, "env": {}}
        return True if cond is None else self._condition(cond, ctx, "success")
