"""Triton Python-backend model: the ranking ONNX file run by onnxruntime on the CPU.

Triton hands `execute` every request the dynamic batcher merged; they are scored in one
onnxruntime call and each output (the score, and the heads where the config names them)
split back per request.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

WARMUP_ROWS = 1100


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input_name = config["input"][0]["name"]
        self.output_names = [output["name"] for output in config["output"]]
        params = config.get("parameters", {})
        threads = int(params.get("intra_op_num_threads", {}).get("string_value", "1"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.onnx_input = self.session.get_inputs()[0].name
        onnx_outputs = [output.name for output in self.session.get_outputs()]
        # The config's first output is the ONNX file's first, whatever its name there; the
        # others (the heads) go by name.
        self.onnx_outputs = [onnx_outputs[0], *self.output_names[1:]]
        missing = set(self.output_names[1:]) - set(onnx_outputs)
        if missing:
            raise pb_utils.TritonModelException(
                f"model.onnx has no output {sorted(missing)}; install it with recsys "
                "install-model, which writes the config's outputs to match"
            )
        # The first run allocates; done here, before Triton reports the model ready, so the
        # first request after a (re)start is not the slow one (the GPU config's model_warmup
        # does the same). As many rows as a typical request's chunk, at most a batch.
        width = int(config["input"][0]["dims"][-1])
        rows = min(WARMUP_ROWS, int(config.get("max_batch_size", 1)) or 1)
        self.session.run(self.onnx_outputs, {self.onnx_input: np.zeros((rows, width), np.float32)})

    def execute(self, requests):
        batches = [
            pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
            for request in requests
        ]
        rows = np.concatenate(batches) if len(batches) > 1 else batches[0]
        answers = self.session.run(self.onnx_outputs, {self.onnx_input: rows})
        answers[0] = answers[0].reshape(-1, 1)
        answers = [np.ascontiguousarray(answer, dtype=np.float32) for answer in answers]
        responses = []
        start = 0
        for batch in batches:
            end = start + batch.shape[0]
            tensors = [
                pb_utils.Tensor(name, answer[start:end])
                for name, answer in zip(self.output_names, answers)
            ]
            responses.append(pb_utils.InferenceResponse(tensors))
            start = end
        return responses

    def finalize(self):
        self.session = None
