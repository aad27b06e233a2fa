"""The run-time library converted code calls: Python operators on tensors
(`pyops`), checked subscripts (`subscripts`), and calling a primitive's code
on one example (`single_example`)."""
