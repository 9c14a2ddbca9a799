"""torchair's ``torch_npu`` for the processes a script starts under ``torchair run``.

While the emulation is installed, this folder is on ``sys.path`` (which ``multiprocessing``'s
spawn and forkserver children copy) and ``$PYTHONPATH`` (other Python children), and
``$TORCHAIR_NPU_EMULATION`` names the emulated device. A child's ``import torch_npu`` runs this
file, which installs the same emulation there; the import then returns the emulated module.
Imported under any other name (a tool walking torchair's files) it does nothing.
"""
if __name__ == "torch_npu":
    __torchair_shim__ = True
    from torchair.compat.emulation import install_in_child

    install_in_child()
