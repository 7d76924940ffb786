# Emulates the row-layout diff's load_row_part (fp32, same op order) against the host model
# (fp64 FWHT) and against the committed 32-lane order (fp32): same bits expected.
import numpy as np
def sign(col):
    h=((col+1)*0x9E3779B9)&0xffffffff
    h=((h^(h>>16))*0x85EBCA6B)&0xffffffff
    return -1.0 if (h>>31) else 1.0
def emulate(row, L):
    d=len(row); F=d//L
    x=[np.array([np.float32(row[q*F+e])*np.float32(sign(q*F+e)) for e in range(F)],dtype=np.float32) for q in range(L)]
    h=1
    while h<F:
        for q in range(L):
            for e in range(F):
                if not (e&h):
                    a,b=x[q][e],x[q][e+h]; x[q][e]=np.float32(a+b); x[q][e+h]=np.float32(a-b)
        h*=2
    m=1
    while m<L:
        new=[]
        for q in range(L):
            other=x[q^m]; s=np.float32(-1.0 if (q&m) else 1.0)
            new.append(np.array([np.float32(x[q][e]*s+other[e]) for e in range(F)],dtype=np.float32))  # fma exact for +-1
        x=new; m*=2
    norm=np.float32(1/np.sqrt(np.float32(d)))
    return np.concatenate([xx*norm for xx in x])
rng=np.random.default_rng(1)
for d in (64,128,256):
    row=rng.standard_normal(d).astype(np.float32)
    ref=np.array([sign(c) for c in range(d)])*row.astype(np.float64)
    # fp64 FWHT
    y=ref.copy(); h=1
    while h<d:
        for c in range(d):
            if not (c&h): a,b=y[c],y[c+h]; y[c]=a+b; y[c+h]=a-b
        h*=2
    y/=np.sqrt(d)
    outs={L:emulate(row,L) for L in (4,8,32)}
    for L,o in outs.items():
        print(d,L,"max|err| vs fp64 =",float(np.max(np.abs(o-y))), "bit-identical to L=32:", bool(np.array_equal(o,outs[32])))
