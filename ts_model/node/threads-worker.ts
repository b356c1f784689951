// A worker of ./threads.ts: instantiates the WebAssembly kernels over the shared memory it is started
// with, runs each job's kernel over the columns it is given, then sets its slot of `done` to 1 (2 if the
// kernel threw) and wakes the waiting thread.

import { parentPort, workerData } from "node:worker_threads";

import type { Job, WorkerSetup } from "./threads.ts";
import { instantiateKernels } from "./wasm-kernels.ts";

const setup = workerData as WorkerSetup;
const kernels = instantiateKernels(setup.memory, setup.module);

parentPort?.on("message", (job: Job) => {
  let status = 1;
  try {
    kernels[job.kind](job.x, job.w, job.o, job.T, job.n, job.m, job.j0, job.j1);
  } catch {
    status = 2;
  }
  Atomics.store(job.done, job.slot, status);
  Atomics.notify(job.done, job.slot);
});
