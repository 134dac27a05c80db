# Source on a lent GPU machine (no network): installs carried wheels (.whl/) and pcietrace into /tmp/site,
# and builds the C libraries in place so `python3 -m pcietrace` and bench/ scripts work from the checkout.
#   . bench/device_setup.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site . >/dev/null || return 1
python3 setup.py -q build_ext --inplace >/dev/null 2>&1 || return 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
