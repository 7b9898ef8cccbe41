// Accuracy of the CPU float exp_f / tanh_f / sigmoid of csrc/common/block_rnn_math.h: max error in ulps
// against the exact (double) value over every 7th float bit pattern (both signs) plus specials; also prints
// the libm-based float sigmoid for comparison. Build line in README.md. Same pragma as the kernel file.
#pragma GCC optimize("no-trapping-math")
#include "common/block_rnn_math.h"
#include <cstdio>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <vector>
using namespace torchops::brnn;
static int64_t ord(float f){int32_t i;memcpy(&i,&f,4);return i<0? (int64_t)INT32_MIN - i : i;}
// ulp error vs correctly-rounded double reference
static double ulperr(float got, double ref){
  if (std::isnan(ref)) return std::isnan(got)?0:1e9;
  if (std::isnan(got)) return 1e9;
  float rf=(float)ref; if (std::isinf(rf)&&!std::isinf(ref)) {}
  // ulp of ref in float
  double a=std::fabs(ref); int e; if (a < 1.17549435e-38) { return std::fabs(got-ref)/1.4012984643e-45; }
  std::frexp(a,&e); double ulp=std::ldexp(1.0,e-24);
  if (a >= 3.4028235677973366e38) return (std::isinf(got)&&((got>0)==(ref>0)))?0:1e9;
  if (std::isinf(got)) return 1e9;
  return std::fabs((double)got-ref)/ulp;
}
__attribute__((noinline)) void run(const float* x, float* e, float* t, float* s, int n){
  for(int k=0;k<n;k++){e[k]=exp_f(x[k]); t[k]=tanh_f(x[k]); s[k]=sigmoid(x[k]);}
}
int main(){
  std::vector<float> xs;
  // all floats in a dense sweep: every 7th bit pattern over all finite + specials
  for (uint32_t b=0;b<0x7f800000u;b+=7){float f;memcpy(&f,&b,4); xs.push_back(f); xs.push_back(-f);}
  float specials[]={INFINITY,-INFINITY,NAN,0.f,-0.f,88.3f,88.5f,88.72f,88.73f,-87.3f,-88.f,-100.f,-103.9f,-104.f,1e-30f,1e-40f};
  for(float f:specials) xs.push_back(f);
  size_t n=xs.size(); std::vector<float> e(n),t(n),s(n); run(xs.data(),e.data(),t.data(),s.data(),n);
  double me=0,mt=0,ms=0; float ae=0,at=0,as=0;
  for(size_t k=0;k<n;k++){double x=xs[k];
    double re=std::exp(x), rt=std::tanh(x), rs=1.0/(1.0+std::exp(-x));
    double ue=ulperr(e[k],re), ut=ulperr(t[k],rt), us=ulperr(s[k],rs);
    if(ue>me){me=ue;ae=xs[k];} if(ut>mt){mt=ut;at=xs[k];} if(us>ms){ms=us;as=xs[k];}
  }
  printf("exp max ulp %.3g at %.9g (got %.9g)\n",me,ae,exp_f(ae));
  printf("tanh max ulp %.3g at %.9g (got %.9g ref %.9g)\n",mt,at,tanh_f(at),std::tanh((double)at));
  printf("sigmoid max ulp %.3g at %.9g (got %.9g ref %.9g)\n",ms,as,sigmoid(as),1/(1+std::exp(-(double)as)));
  for(float f:specials) printf("x=%g exp=%g tanh=%g sig=%g\n",f,exp_f(f),tanh_f(f),sigmoid(f));
  // libm reference ulp
  double le=0,lt=0; for(size_t k=0;k<n;k+=3){double x=xs[k]; le=std::max(le,ulperr(expf(xs[k]),std::exp(x))); lt=std::max(lt,ulperr(tanhf(xs[k]),std::tanh(x)));}
  printf("libm expf %.3g tanhf %.3g\n",le,lt);
}
// libm-based float sigmoid for comparison
struct Init{Init(){
  double m=0; float am=0;
  for (uint32_t b=0;b<0x7f800000u;b+=7){float f;memcpy(&f,&b,4); for(float x: {f,-f}){ float g=1.f/(1.f+expf(-x)); double r=1.0/(1.0+std::exp(-(double)x)); double u=ulperr(g,r); if(u>m && std::fabs(x)<80){m=u;am=x;}}}
  printf("libm-float sigmoid (|x|<80) max ulp %.3g at %g\n",m,am);
}} init_;
