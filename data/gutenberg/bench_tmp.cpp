#include "tokenizer.h"
#include "text_reader.h"
#include <chrono>
#include <cstdio>
#include <algorithm>
int main(int, char**argv){
  std::string t=read_text_file(argv[1]);
  double best_cold=1e9, best_warm=1e9;
  for(int k=0;k<8;k++){
    auto tok=GPT2Tokenizer::load("data/gpt2");
    for (int w=0; w<2; w++) {
      auto t0=std::chrono::steady_clock::now();
      auto ids=tok.encode_with_special(t);
      double s=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
      if(w==0) best_cold=std::min(best_cold,s); else best_warm=std::min(best_warm,s);
    }
  }
  printf("cold %.1f MB/s  warm %.1f MB/s\n",t.size()/best_cold/1e6,t.size()/best_warm/1e6);
}
