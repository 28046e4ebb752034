# Importing anything from this part (`from partN_....flash_attention import flash_attention`,
# `python -m partN_....walkthrough`) first decides where Triton kernels run: on a machine without a
# CUDA GPU, common.runtime switches on Triton's interpreter, which must happen before triton is imported.
import common.runtime  # noqa: F401
