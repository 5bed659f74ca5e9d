//! Host side of the lease protocol between the CUDA shim and this daemon
//! (arrives with the cuda-shim work, issue 4).
