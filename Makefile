# Two entry points (see README): `make course` and `make test`.
.PHONY: setup course test lessons

setup:
	bash scripts/setup.sh

course: setup
	.venv/bin/jupyter lab lessons/

test: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} .venv/bin/python -m pytest -n $${MINILLM_TEST_WORKERS:-2} --dist loadfile

lessons: setup
	.venv/bin/python -m minillm.course build
