"""Cost and prediction: the one cost model, the MoE terms, and the prediction that interprets the
layer program against it."""
