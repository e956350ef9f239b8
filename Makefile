# Convenience targets; the two set-up commands are scripts/demo.sh and scripts/test.sh.
.PHONY: demo test lint fmt goldens bench airflow-envs docs

demo:
	bash scripts/demo.sh

test:
	bash scripts/test.sh

lint:
	.venv/bin/ruff check .
	.venv/bin/black --check -q .
	.venv/bin/mypy

fmt:
	.venv/bin/ruff check --fix .
	.venv/bin/black -q .

airflow-envs:
	.venv/bin/python scripts/airflow_envs.py --jobs 2

goldens:
	.venv/bin/python -m dpone_generator.update_goldens

docs:
	.venv/bin/python scripts/build_docs.py

bench:
	.venv/bin/python bench/plan_bench.py
	.venv/bin/python bench/plan_bench.py --hours --clock cpu
	.venv/bin/python bench/plan_bench.py --pod 40 --clock cpu
	.venv/bin/python bench/ledger_bench.py
	.venv/bin/python bench/data_bench.py
	.venv/bin/python bench/generate_bench.py

-include mk/verify.mk
