# Sourced by .ci/run: CI's own Python environment. A venv made afresh from the machine's python3 at .ci/venv
# (ignored by git) and put first on PATH, so that every `python3 -m pip install` after it installs there: the
# machine's own interpreter keeps its packages as they are (other programs use them) and is left no `stackgate`
# pointing at this clone. The README's commands then run unchanged, their `python3` being the venv's.
# VIRTUAL_ENV is left unset: the tests read it as the stack's venv, as a user's shell would set it.
rm -rf .ci/venv
python3 -m venv .ci/venv
PATH="$PWD/.ci/venv/bin:$PATH"
export PATH
hash -r
