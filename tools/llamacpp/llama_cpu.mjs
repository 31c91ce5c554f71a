// llama.cpp's CPU backend through node-llama-cpp, loaded the one way both harnesses here use:
// no GPU, never a build from source, `threads` threads, the model's layers all on the CPU.
// With a `logger`, llama.cpp's debug log goes to it (bench.mjs reads the backend's name from
// it); without one, only errors are printed.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

export async function loadCpuModel({modelPath, threads, logger}) {
  const llama = await getLlama({
    gpu: false, build: "never", maxThreads: threads,
    logLevel: logger ? LlamaLogLevel.debug : LlamaLogLevel.error,
    ...(logger ? {logger} : {}),
  });
  const model = await llama.loadModel({modelPath, gpuLayers: 0});
  return {llama, model};
}
