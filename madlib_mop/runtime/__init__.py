"""What runs inside the server: the sub-epoch, model state, Keras JSON, parameters,
TensorFlow set-up, the PL/Python bridge."""
