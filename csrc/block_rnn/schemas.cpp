// GRU / LSTM block op schemas. Kernels: cpu/ and cuda/block_rnn_kernel.*; autograd: autograd/block_rnn.cpp.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(torchops, m) {
  // ---- GRU (TF GRUBlockCell / GRUBlockCellGrad) ----
  m.def(
      "gru_block_cell(Tensor x, Tensor h_prev, Tensor w_ru, Tensor w_c, Tensor b_ru, Tensor b_c) "
      "-> (Tensor r, Tensor u, Tensor c, Tensor h)");
  m.def(
      "gru_block_cell_grad(Tensor x, Tensor h_prev, Tensor w_ru, Tensor w_c, Tensor b_ru, Tensor b_c, Tensor r, "
      "Tensor u, Tensor c, Tensor d_h) -> (Tensor d_x, Tensor d_h_prev, Tensor d_c_bar, Tensor d_r_bar_u_bar)");
  // Internal: the autograd backward of gru_block_cell: gradients arriving at all four
  // outputs (each optional), all six input gradients.
  m.def(
      "_gru_block_cell_backward(Tensor x, Tensor h_prev, Tensor w_ru, Tensor w_c, Tensor r, Tensor u, Tensor c, "
      "Tensor? d_r, Tensor? d_u, Tensor? d_c, Tensor? d_h) "
      "-> (Tensor d_x, Tensor d_h_prev, Tensor d_w_ru, Tensor d_w_c, Tensor d_b_ru, Tensor d_b_c)");
  // ---- BlockGRU (torchops): the GRUBlockCell recurrence over [T, B, I] ----
  m.def(
      "block_gru(Tensor seq_len_max, Tensor x, Tensor h_prev, Tensor w_ru, Tensor w_c, Tensor b_ru, Tensor b_c) "
      "-> (Tensor r, Tensor u, Tensor c, Tensor h)");
  m.def(
      "block_gru_grad(Tensor seq_len_max, Tensor x, Tensor h_prev, Tensor w_ru, Tensor w_c, Tensor b_ru, "
      "Tensor b_c, Tensor r, Tensor u, Tensor c, Tensor h, Tensor h_grad, Tensor? r_grad=None, "
      "Tensor? u_grad=None, Tensor? c_grad=None) "
      "-> (Tensor x_grad, Tensor h_prev_grad, Tensor w_ru_grad, Tensor w_c_grad, Tensor b_ru_grad, "
      "Tensor b_c_grad)");
  // ---- LSTM (TF LSTMBlockCell / LSTMBlockCellGrad, BlockLSTM(V2) / BlockLSTMGrad(V2)) ----
  m.def(
      "lstm_block_cell(Tensor x, Tensor cs_prev, Tensor h_prev, Tensor w, Tensor wci, Tensor wcf, Tensor wco, "
      "Tensor b, float forget_bias=1.0, float cell_clip=3.0, bool use_peephole=False) "
      "-> (Tensor i, Tensor cs, Tensor f, Tensor o, Tensor ci, Tensor co, Tensor h)");
  m.def(
      "lstm_block_cell_grad(Tensor x, Tensor cs_prev, Tensor h_prev, Tensor w, Tensor wci, Tensor wcf, "
      "Tensor wco, Tensor b, Tensor i, Tensor cs, Tensor f, Tensor o, Tensor ci, Tensor co, Tensor cs_grad, "
      "Tensor h_grad, bool use_peephole) "
      "-> (Tensor cs_prev_grad, Tensor dicfo, Tensor wci_grad, Tensor wcf_grad, Tensor wco_grad)");
  // Internal: autograd backward of lstm_block_cell with gradients at all seven outputs.
  m.def(
      "_lstm_block_cell_backward(Tensor x, Tensor cs_prev, Tensor h_prev, Tensor w, Tensor wci, Tensor wcf, "
      "Tensor wco, Tensor b, Tensor i, Tensor cs, Tensor f, Tensor o, Tensor ci, Tensor co, Tensor? cs_grad, "
      "Tensor? h_grad, Tensor? i_grad, Tensor? f_grad, Tensor? o_grad, Tensor? ci_grad, Tensor? co_grad, "
      "bool use_peephole) "
      "-> (Tensor x_grad, Tensor cs_prev_grad, Tensor h_prev_grad, Tensor w_grad, Tensor wci_grad, "
      "Tensor wcf_grad, Tensor wco_grad, Tensor b_grad)");
  m.def(
      "block_lstm(Tensor seq_len_max, Tensor x, Tensor cs_prev, Tensor h_prev, Tensor w, Tensor wci, Tensor wcf, "
      "Tensor wco, Tensor b, float forget_bias=1.0, float cell_clip=3.0, bool use_peephole=False) "
      "-> (Tensor i, Tensor cs, Tensor f, Tensor o, Tensor ci, Tensor co, Tensor h)");
  m.def(
      "block_lstm_v2(Tensor seq_len_max, Tensor x, Tensor cs_prev, Tensor h_prev, Tensor w, Tensor wci, "
      "Tensor wcf, Tensor wco, Tensor b, float cell_clip=0.0, bool use_peephole=False) "
      "-> (Tensor i, Tensor cs, Tensor f, Tensor o, Tensor ci, Tensor co, Tensor h)");
  m.def(
      "block_lstm_grad(Tensor seq_len_max, Tensor x, Tensor cs_prev, Tensor h_prev, Tensor w, Tensor wci, "
      "Tensor wcf, Tensor wco, Tensor b, Tensor i, Tensor cs, Tensor f, Tensor o, Tensor ci, Tensor co, Tensor h, "
      "Tensor cs_grad, Tensor h_grad, bool use_peephole) "
      "-> (Tensor x_grad, Tensor cs_prev_grad, Tensor h_prev_grad, Tensor w_grad, Tensor wci_grad, "
      "Tensor wcf_grad, Tensor wco_grad, Tensor b_grad)");
  m.def(
      "block_lstm_grad_v2(Tensor seq_len_max, Tensor x, Tensor cs_prev, Tensor h_prev, Tensor w, Tensor wci, "
      "Tensor wcf, Tensor wco, Tensor b, Tensor i, Tensor cs, Tensor f, Tensor o, Tensor ci, Tensor co, Tensor h, "
      "Tensor cs_grad, Tensor h_grad, bool use_peephole) "
      "-> (Tensor x_grad, Tensor cs_prev_grad, Tensor h_prev_grad, Tensor w_grad, Tensor wci_grad, "
      "Tensor wcf_grad, Tensor wco_grad, Tensor b_grad)");
  // Internal: autograd backward of block_lstm(_v2) with gradients at all seven outputs.
  m.def(
      "_block_lstm_backward(Tensor seq_len_max, Tensor x, Tensor cs_prev, Tensor h_prev, Tensor w, Tensor wci, "
      "Tensor wcf, Tensor wco, Tensor b, Tensor i, Tensor cs, Tensor f, Tensor o, Tensor ci, Tensor co, Tensor h, "
      "Tensor? cs_grad, Tensor? h_grad, Tensor? i_grad, Tensor? f_grad, Tensor? o_grad, Tensor? ci_grad, "
      "Tensor? co_grad, bool use_peephole, bool ifco) "
      "-> (Tensor x_grad, Tensor cs_prev_grad, Tensor h_prev_grad, Tensor w_grad, Tensor wci_grad, "
      "Tensor wcf_grad, Tensor wco_grad, Tensor b_grad)");
}
