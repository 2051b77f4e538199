"""`popart._internal`: home of `popart._internal.ir`, the IR view PopXL code inspects."""
