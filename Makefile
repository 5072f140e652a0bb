# Two entry points (see README): `make course` and `make test`.
.PHONY: setup course test lessons

setup:
	bash scripts/setup.sh

# JupyterLab on lessons/. It prints its URL with the token; it opens a browser only where there is
# a display (macOS, or DISPLAY/WAYLAND_DISPLAY set). As root (Docker, CI, cloud VMs) it passes
# --allow-root. PORT (or JUPYTER_PORT) and IP choose where it listens, for a container:
#   make course IP=0.0.0.0 PORT=8888      (a port given is used or the start fails, never moved)
PORT ?= $(JUPYTER_PORT)
COURSE_FLAGS = $(if $(IP),--ServerApp.ip=$(IP)) \
	$(if $(PORT),--ServerApp.port=$(PORT) --ServerApp.port_retries=0) \
	$(if $(filter 0,$(shell id -u)),--allow-root) \
	$(if $(or $(DISPLAY),$(WAYLAND_DISPLAY),$(filter Darwin,$(shell uname -s))),,--no-browser)

course: setup
	.venv/bin/jupyter lab $(strip $(COURSE_FLAGS)) lessons/

test: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} .venv/bin/python -m pytest -n $${MINILLM_TEST_WORKERS:-2} --dist loadfile --no-loadscope-reorder --durations=25

lessons: setup
	.venv/bin/python -m minillm.course build
